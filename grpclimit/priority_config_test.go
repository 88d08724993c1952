package grpclimit

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

// The priority functions' construction errors are configuration errors,
// as every other one (see httplimit's TestPriorityConfigErrors).
func TestPriorityConfigErrors(t *testing.T) {
	for name, err := range map[string]error{
		"PriorityMetadata bad proxy": second(PriorityMetadata("x-priority", &PriorityOptions{TrustedProxies: []string{"not an address"}})),
		"PriorityMetadata default":   second(PriorityMetadata("x-priority", &PriorityOptions{Default: "urgent"})),
		"PriorityFrom default":       second(PriorityFrom(Global(), "urgent")),
	} {
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
		if strings.Count(err.Error(), "grpclimit:") != 1 {
			t.Errorf("%s: %q names the package more than once", name, err)
		}
		if strings.HasSuffix(name, "default") && !errors.Is(err, sluice.ErrInvalidPriority) {
			t.Errorf("%s: %v, want sluice.ErrInvalidPriority too", name, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }
