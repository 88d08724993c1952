package config

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice"
)

// TestNewEnvoyPolicyBadName: a bad name is ErrConfig, as in a file.
func TestNewEnvoyPolicyBadName(t *testing.T) {
	for _, name := range []string{"", "a\nb", "\xff"} {
		if _, err := NewEnvoyPolicy(name, "d", sluice.PerSecond(1)); !errors.Is(err, ErrConfig) {
			t.Errorf("NewEnvoyPolicy(%q): %v, want ErrConfig", name, err)
		}
	}
}
