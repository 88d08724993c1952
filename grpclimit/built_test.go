package grpclimit

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
)

// New refuses a store that was never built: it used to be accepted and
// then fail every call with Internal.
func TestNewRefusesUnbuiltStore(t *testing.T) {
	t.Parallel()
	rules := []Rule{{Name: "api", Limit: sluice.PerMinute(10), Key: Global()}}
	for name, store := range map[string]sluice.Store{
		"nil *memory.Store":     (*memory.Store)(nil),
		"zero memory.Store":     &memory.Store{},
		"zero redisstore.Store": &redisstore.Store{},
	} {
		if in, err := New(store, rules, nil); !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, sluice.ErrStoreNotBuilt) {
			t.Errorf("New(%s): %v, %v; want ErrInvalidConfig and ErrStoreNotBuilt", name, in, err)
		}
	}
}
