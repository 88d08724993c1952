package promsluice_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/promsluice"
)

func TestLeaseCollector(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := func() time.Time { return now }
	mem := memory.New(&memory.Options{Clock: clock, SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	ls, err := lease.New(mem, &lease.Options{MaxStaleness: 100 * time.Millisecond, Size: 4, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(promsluice.NewLeaseCollector(ls, nil))

	// One grant of 4: the first take goes through the store, three are
	// answered from the lease.
	ctx := context.Background()
	for range 4 {
		if d, err := ls.Take(ctx, "k", sluice.PerSecond(100), 1); err != nil || !d.Allowed {
			t.Fatalf("Take = %+v, %v", d, err)
		}
	}
	for name, want := range map[string]float64{
		"sluice_lease_local_decisions_total": 3,
		"sluice_lease_grants_total":          1,
		"sluice_lease_units_granted_total":   4,
		"sluice_lease_units_returned_total":  0,
		"sluice_lease_keys":                  1,
		"sluice_lease_keys_leased":           0, // its 4 units spent
	} {
		if got := gather(t, reg, name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if v, ok := promtest.Value(t, reg, "sluice_lease_units_lost_total", nil); !ok || v != 0 {
		t.Errorf("sluice_lease_units_lost_total = %v (exposed: %v), want 0", v, ok)
	}
	// A lease with units to spend is counted until its D ends.
	if d, err := ls.Take(ctx, "other", sluice.PerSecond(100), 1); err != nil || !d.Allowed {
		t.Fatalf("Take(other) = %+v, %v", d, err)
	}
	if got := gather(t, reg, "sluice_lease_keys_leased", nil); got != 1 {
		t.Errorf("sluice_lease_keys_leased = %v, want 1", got)
	}
	now = now.Add(200 * time.Millisecond)
	for name, want := range map[string]float64{"sluice_lease_keys": 2, "sluice_lease_keys_leased": 0} {
		if got := gather(t, reg, name, nil); got != want {
			t.Errorf("past D, %s = %v, want %v", name, got, want)
		}
	}
	if err := ls.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := gather(t, reg, "sluice_lease_keys", nil), 0.0; got != want {
		t.Errorf("after Close, sluice_lease_keys = %v, want %v", got, want)
	}
	// Close gave back other's 3 unused units 200 ms after its grant: at
	// 100 a second the return rule keeps 20, so none went back.
	if got, want := gather(t, reg, "sluice_lease_units_forfeited_total", nil), 3.0; got != want {
		t.Errorf("after Close, sluice_lease_units_forfeited_total = %v, want %v", got, want)
	}
}

func TestZeroLeaseCollector(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(new(promsluice.LeaseCollector))
	if mfs, err := reg.Gather(); err != nil || len(mfs) != 0 {
		t.Errorf("a zero LeaseCollector gathers %d families, %v; want none", len(mfs), err)
	}
	// A nil one, as a nil Collector: nothing, no panic.
	var c *promsluice.LeaseCollector
	c.Describe(make(chan *prometheus.Desc, 16))
	c.Collect(make(chan prometheus.Metric, 16))
}
