package server

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// The lines redisstore.FollowSentinels logs, which the fault tests, the
// docs and operators' alerts look for.
const (
	sentinelSwitchMsg = "redis: sentinel switched master"
	replacedMasterMsg = "redis: on a master the Sentinels replaced: its connections closed"
	agreedMasterMsg   = "redis: on the master the Sentinels announced"
)

// TestProbeAfterSwitch: after a switch the breaker is probed once, when
// the client's ping first succeeds; never while the pings fail, and not
// after the follower's context ends.
func TestProbeAfterSwitch(t *testing.T) {
	var pings, probes atomic.Int32
	ping := func(context.Context) error {
		if pings.Add(1) <= 2 {
			return errors.New("not yet") // the client still on the old master
		}
		return nil
	}
	probe := func(context.Context) error { probes.Add(1); return nil }
	probeAfterSwitch(context.Background(), ping, probe)
	if pings.Load() != 3 || probes.Load() != 1 {
		t.Errorf("%d pings, %d probes; want 3 (two failed), then one probe", pings.Load(), probes.Load())
	}

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	probes.Store(0)
	probeAfterSwitch(ctx, func(context.Context) error { return errors.New("down") }, probe)
	if d := time.Since(start); d > time.Second || probes.Load() != 0 {
		t.Errorf("pings failing, context ended after 100ms: returned after %v with %d probes", d, probes.Load())
	}
}

// TestHealthSentinelReason: a Sentinel client on a replaced master makes
// the instance degraded, with the reason, until it is told otherwise.
func TestHealthSentinelReason(t *testing.T) {
	h := newHealth(healthOptions{policy: "local", withPolicy: true, store: "redis"})
	h.setSentinel("Redis master a was replaced by b")
	if st := h.Status(); !st.Degraded || !st.Ready || !slices.Contains(st.Reasons, "Redis master a was replaced by b") {
		t.Errorf("status %+v, want ready, degraded, with the reason", st)
	}
	h.setSentinel("")
	if st := h.Status(); st.Degraded || len(st.Reasons) != 0 {
		t.Errorf("status %+v, want not degraded", st)
	}
}
