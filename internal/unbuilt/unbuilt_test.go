package unbuilt

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice"
)

// Every store of the list is one sluice.CheckBuilt refuses, under a name
// of its own: a middleware test that passes on it then tests the
// middleware, not the list.
func TestStoresAreUnbuilt(t *testing.T) {
	seen := map[string]bool{}
	for _, u := range Stores() {
		if seen[u.Name] {
			t.Errorf("%s listed twice", u.Name)
		}
		seen[u.Name] = true
		if err := sluice.CheckBuilt(u.Store); !errors.Is(err, sluice.ErrStoreNotBuilt) {
			t.Errorf("CheckBuilt(%s) = %v, want ErrStoreNotBuilt", u.Name, err)
		}
	}
}
