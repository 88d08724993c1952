package grpclimit

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/unbuilt"
)

// New refuses a store that was never built: it used to be accepted and
// then fail every call with Internal.
func TestNewRefusesUnbuiltStore(t *testing.T) {
	t.Parallel()
	rules := []Rule{{Name: "api", Limit: sluice.PerMinute(10), Key: Global()}}
	for _, u := range unbuilt.Stores() {
		if in, err := New(u.Store, rules, nil); !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, sluice.ErrStoreNotBuilt) {
			t.Errorf("New(%s): %v, %v; want ErrInvalidConfig and ErrStoreNotBuilt", u.Name, in, err)
		}
	}
}
