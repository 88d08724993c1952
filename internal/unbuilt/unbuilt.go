// Package unbuilt lists stores that were never built (zero values, typed
// nil pointers), for the tests of every constructor that must refuse them
// with sluice.ErrStoreNotBuilt. One list, so that a store type added to
// one middleware's test is tried on the others too.
package unbuilt

import (
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// Store is a store never built and its name in a test's output.
type Store struct {
	Name  string
	Store sluice.Store
}

// Stores returns the list, made afresh on each call so that tests running
// in parallel share no zero value.
func Stores() []Store {
	return []Store{
		{"nil *memory.Store", (*memory.Store)(nil)},
		{"zero memory.Store", &memory.Store{}},
		{"nil *redisstore.Store", (*redisstore.Store)(nil)},
		{"zero redisstore.Store", &redisstore.Store{}},
		{"nil *lease.Store", (*lease.Store)(nil)},
		{"zero lease.Store", &lease.Store{}},
		{"zero resilient.Store", &resilient.Store{}},
		{"nil *resilient.MultiStore", (*resilient.MultiStore)(nil)},
	}
}
