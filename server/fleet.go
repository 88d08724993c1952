package server

import (
	"cmp"
	"fmt"

	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// startFleet prepares this instance's registration in rs's fleet registry
// (Start registers it, once listening) and keeps the fleet size that the local fallback divides limits by (FleetSize wins over
// what is discovered), exported as sluice_fleet_size. The Fleet logs each
// change of size and each loss and return of the registry itself.
func (s *Server) startFleet(rs *redisstore.Store) (*resilient.Fleet, error) {
	size := newGauge("sluice_fleet_size", "Instances sharing Redis, which the local fallback divides every limit by: --fleet-size, or as discovered (grows at once, shrinks after --fleet-shrink of smaller counts, kept while Redis is away).")
	reachable := newGauge("sluice_fleet_registry_reachable", "1 while this instance's fleet registration reaches Redis (renewed every second).")
	s.metrics.reg.MustRegister(size, reachable)
	// Only the local policy takes a share: under the others the count
	// changes no decision, and the gauge is not exported.
	local := s.health.policy == "local"
	counted := newGauge("sluice_fleet_counted", "Under --failure-policy local: 1 while the fleet counts this instance, so that the policy may take its share (--fleet-size is set, or a registration succeeded within the last --fleet-shrink plus 3s); 0 and the policy refuses.")
	if local {
		s.metrics.reg.MustRegister(counted)
	}
	// The state until the first change: an unreachable registry at start
	// reports none.
	size.Set(float64(cmp.Or(s.opts.FleetSize, resilient.DefaultFleetSize)))
	// Counted with an explicit size; else not until a registration is
	// answered, which OnChange reports (from the first one, in NewFleet).
	counted.Set(boolGauge(s.opts.FleetSize > 0))
	s.health.fleetCounted(s.opts.FleetSize > 0, false)
	f, err := resilient.NewFleet(rs.Membership(), &resilient.FleetOptions{
		Size:   s.opts.FleetSize,
		Shrink: s.opts.FleetShrink,
		Logger: s.log,
		// Registered by Start once the listeners are bound: a start that
		// fails must not be counted by the others for --fleet-shrink.
		Deferred: true,
		OnChange: func(e resilient.FleetEvent) {
			size.Set(float64(e.Size))
			reachable.Set(boolGauge(e.Reachable))
			counted.Set(boolGauge(e.Counted))
			s.health.fleetCounted(e.Counted, e.Members > 0) // Members: the last answered count
		},
	})
	if err != nil {
		return nil, fmt.Errorf("server: fleet: %w", err)
	}
	return f, nil
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
