package server

import (
	"context"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/promsluice"
)

// Leases. A policy with `lease: D` is answered from leases (package lease):
// each instance takes part of a key's budget from the store in one step and
// spends it in memory for at most D, so the fleet may admit up to r × D
// beyond the limit. The service puts one lease.Store in front of any store
// that can grant (Redis behind the failure policy, the memory store); its
// For reads the configuration in force, so a reload applies to the next
// grant, and every lease taken before it ends within its own D. Keys of
// other policies, block keys and limits a request carries itself pass
// through to the store, exact.

// newLeases returns a lease store in front of store, or nil when store
// cannot grant. clock is nil but in tests: the lease store's own clock is
// monotonic.
func (s *Service) newLeases(store sluice.Store, clock func() time.Time, o *ServiceOptions) *lease.Store {
	g, ok := store.(sluice.Granter)
	if !ok {
		return nil
	}
	ls, err := lease.New(g, &lease.Options{For: s.leaseFor, FleetSize: o.FleetSize, Clock: clock})
	if err != nil { // New refuses only a nil granter and neither For nor MaxStaleness
		s.log.Error("leases off", "err", err)
		return nil
	}
	if o.Metrics != nil {
		if err := o.Metrics.reg.Register(promsluice.NewLeaseCollector(ls, nil)); err != nil {
			s.log.Warn("lease metrics not exported", "err", err)
		}
	}
	return ls
}

// leaseFor is the lease store's Options.For: the lease of the policy whose
// key key is, under the configuration in force. Zero (no lease) for
// policies without one, block keys, keys of limits a request carried, and
// a limit the lease no longer fits (one of an older configuration, during
// a reload).
func (s *Service) leaseFor(key string, limit sluice.Limit) time.Duration {
	leases := s.snap.Load().leases
	if len(leases) == 0 {
		return 0
	}
	stem, ok := s.keyer.Stem(key)
	if !ok {
		return 0
	}
	if d := leases[stem]; d <= limit.Period {
		return d
	}
	return 0
}

// Close returns the unused units of this instance's leases to the store;
// call it before the store closes. Decisions still work afterwards, taking
// new leases. Without leases (a store that cannot grant) it does nothing.
func (s *Service) Close(ctx context.Context) error {
	if s.leases == nil {
		return nil
	}
	return s.leases.Close(ctx)
}

// LeaseStats returns the counters of the service's leases: all zero when
// the store cannot grant.
func (s *Service) LeaseStats() lease.Stats {
	if s.leases == nil {
		return lease.Stats{}
	}
	return s.leases.Stats()
}
