package promsluice

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/lease"
)

var _ prometheus.Collector = (*LeaseCollector)(nil)

// LeaseCollector exposes a lease.Store's counters (lease.Stats), read once
// per scrape:
//
//	sluice_lease_local_decisions_total     decisions answered from a lease, without the store
//	sluice_lease_grants_total              grant calls sent to the store
//	sluice_lease_units_granted_total       units the store granted
//	sluice_lease_units_returned_total      unused units the store took back
//	sluice_lease_units_lost_total          units the store took for requests that could not spend them
//	sluice_lease_units_forfeited_total     unused units returns did not give back (the return rule's keep)
//	sluice_lease_keys                      keys tracked now: a lease, a remembered denial or only demand
//	sluice_lease_keys_leased               keys holding a live lease now
//
// The zero value exposes nothing; build one with NewLeaseCollector.
type LeaseCollector struct {
	stats                                                           func() lease.Stats
	local, grants, granted, returned, lost, forfeited, keys, leased *prometheus.Desc
}

// NewLeaseCollector returns a LeaseCollector for s (opts.Namespace prefixes
// the names; opts' other fields do not apply). Register it once.
func NewLeaseCollector(s *lease.Store, opts *Options) *LeaseCollector {
	ns := "sluice"
	if opts != nil && opts.Namespace != "" {
		ns = opts.Namespace
	}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "lease", name), help, nil, nil)
	}
	return &LeaseCollector{
		stats:     s.Stats,
		local:     desc("local_decisions_total", "Decisions answered from a lease in this process, without a store call."),
		grants:    desc("grants_total", "Grant calls sent to the store: the store calls leased keys still cost."),
		granted:   desc("units_granted_total", "Units the store granted to this process's leases."),
		returned:  desc("units_returned_total", "Unused lease units the store took back (at expiry, on a new grant, at shutdown)."),
		lost:      desc("units_lost_total", "Units the store took for requests that could not spend them: a lease ended while the store's call for the rest of the request was out, and the store then denied the lease's share, or the units it had taken were too old to go with it."),
		forfeited: desc("units_forfeited_total", "Unused lease units that returns did not give back: the return rule keeps one unit per Interval begun since the grant (the price of the over-admission bound), and a window that has ended takes none. Leases that end unspent show here."),
		keys:      desc("keys", "Keys this process tracks now: a lease, a remembered denial, or only their demand."),
		leased:    desc("keys_leased", "Keys holding a live lease in this process now: units to spend, within their maximum staleness. A key counts once per limit it is leased under."),
	}
}

// Describe implements prometheus.Collector.
func (c *LeaseCollector) Describe(ch chan<- *prometheus.Desc) {
	if c == nil || c.stats == nil {
		return // a nil or zero LeaseCollector
	}
	for _, d := range [...]*prometheus.Desc{c.local, c.grants, c.granted, c.returned, c.lost, c.forfeited, c.keys, c.leased} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *LeaseCollector) Collect(ch chan<- prometheus.Metric) {
	if c == nil || c.stats == nil {
		return // a nil or zero LeaseCollector
	}
	st := c.stats()
	for d, v := range map[*prometheus.Desc]uint64{c.local: st.Local, c.grants: st.Grants, c.granted: st.Granted, c.returned: st.Returned, c.lost: st.Lost, c.forfeited: st.Forfeited} {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(c.leased, prometheus.GaugeValue, float64(st.Leased))
}
