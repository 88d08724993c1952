package httplimit

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

// The priority functions' construction errors are configuration errors,
// as every other one: a caller checking errors.Is(err, ErrInvalidConfig)
// must not let a bad proxy list or default through, nor read the
// package's name twice in the message.
func TestPriorityConfigErrors(t *testing.T) {
	for name, err := range map[string]error{
		"PriorityHeader bad proxy": second(PriorityHeader("X-Priority", &PriorityOptions{TrustedProxies: []string{"not an address"}})),
		"PriorityHeader default":   second(PriorityHeader("X-Priority", &PriorityOptions{Default: "urgent"})),
		"PriorityFrom default":     second(PriorityFrom(Global(), "urgent")),
	} {
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
		if strings.Count(err.Error(), "httplimit:") != 1 {
			t.Errorf("%s: %q names the package more than once", name, err)
		}
		if strings.HasSuffix(name, "default") && !errors.Is(err, sluice.ErrInvalidPriority) {
			t.Errorf("%s: %v, want sluice.ErrInvalidPriority too", name, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }
