//go:build unix

package server

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// causeLimit is the limit of the policy the one-cause tests load: never
// reached, so that every decision is a call to Redis.
const causeLimit = "fixed_window 1000000000/1h"

// startCauseServer runs the service on url under the local policy, its
// decisions bounded at 50 ms and its watch checking every 200 ms, with
// load on keys k0..k9.
func startCauseServer(t *testing.T, url string) (*proc, *syncBuffer) {
	t.Helper()
	config := writeConfig(t, "domain: d\npolicies:\n  - name: api\n    limit: "+causeLimit+"\n")
	fp, _, err := ParseFailurePolicy("local")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	srv := runServer(t, Options{ConfigFile: config, RedisURL: url, FailurePolicy: fp, StoreCheckInterval: 200 * time.Millisecond,
		DecisionTimeout: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	p := &proc{http: srv.HTTPAddr(), grpc: srv.GRPCAddr()}
	stop := keepCalling(2, 2*time.Millisecond, func(w int) {
		for i := range 5 {
			sendKey(p, "api", fmt.Sprint("k", w*5+i))
		}
	})
	t.Cleanup(stop)
	return p, logs
}

// oneCause asserts that every cause the service gives a store failure
// (the store's or a master's line, sluice_store_transitions_total, the
// failed calls' sluice_store_errors_total, /v1/status) is want, none the
// other of stalled and unreachable.
func oneCause(t *testing.T, p *proc, logs *syncBuffer, want string) {
	t.Helper()
	other := map[string]string{"stalled": "unreachable", "unreachable": "stalled"}[want]
	logged(t, logs, "resilient: breaker open")
	time.Sleep(500 * time.Millisecond) // the breaker's probes fail, more checks fail
	if strings.Contains(logs.String(), "cause="+other) {
		t.Errorf("a failure told as %s, want %s:\n%s", other, want, logs.String())
	}
	_, body := p.get(t, "/metrics")
	series := grepLines(body, "sluice_store_errors_total{") + grepLines(body, "sluice_store_transitions_total{")
	if !strings.Contains(series, `cause="`+want+`"`) || strings.Contains(series, `cause="`+other+`"`) {
		t.Errorf("want the failed calls and the store's transitions counted as %s only:\n%s", want, series)
	}
	_, st := p.getJSON(t, "/v1/status")
	if s := fmt.Sprint(st); strings.Contains(s, other+":") || strings.Contains(s, "cause:"+other) {
		t.Errorf("/v1/status says %s, want %s: %v", other, want, st)
	}
}

// TestFaultStoreOneCause: Redis stopped (SIGSTOP: it accepts connections,
// the kernel completing the handshake, and answers nothing) is stalled for
// the breaker's calls and the service's checks alike: `store lost`,
// sluice_store_transitions_total and sluice_store_errors_total say
// stalled, as /v1/status does; before, the calls said stalled and the
// check, timed out, unreachable. Redis killed (its port refusing) is
// unreachable for both. Standalone and behind Sentinels (which do not
// fail over within the test).
func TestFaultStoreOneCause(t *testing.T) {
	race.SkipTiming(t)
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct{ how, want string }{{"sigstop", "stalled"}, {"kill", "unreachable"}} {
			t.Run(tc.how, func(t *testing.T) {
				r := startRedis(t)
				p, logs := startCauseServer(t, r.url())
				logged(t, logs, "Redis checked")
				time.Sleep(200 * time.Millisecond)
				if tc.how == "sigstop" {
					r.pause(t)
					defer r.resume(t)
				} else {
					r.Stop()
				}
				logged(t, logs, `msg="store lost"`, "cause="+tc.want)
				oneCause(t, p, logs, tc.want)
			})
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct{ how, want string }{{"sigstop", "stalled"}, {"kill", "unreachable"}} {
			t.Run(tc.how, func(t *testing.T) {
				s := redistest.StartSentinel(t, &redistest.SentinelOptions{Sentinels: 1, Quorum: 1, DownAfter: time.Minute})
				p, logs := startCauseServer(t, s.URL())
				logged(t, logs, "Redis checked")
				time.Sleep(200 * time.Millisecond)
				if tc.how == "sigstop" {
					s.Master.Pause(t)
					defer s.Master.Resume(t)
				} else {
					s.Master.Kill()
				}
				logged(t, logs, `msg="store lost"`, "cause="+tc.want)
				oneCause(t, p, logs, tc.want)
			})
		}
	})
}

// TestFaultClusterMasterOneCause: one Redis Cluster master of three stopped
// (SIGSTOP) fails the service's checks as stalled, as its breaker's calls
// do: the master's line, sluice_store_node_up's reason in /v1/status and
// the failed calls' counts say stalled. Killed, unreachable.
func TestFaultClusterMasterOneCause(t *testing.T) {
	race.SkipTiming(t)
	for _, tc := range []struct{ how, want string }{{"sigstop", "stalled"}, {"kill", "unreachable"}} {
		t.Run(tc.how, func(t *testing.T) {
			t.Parallel()
			cl := redistest.StartCluster(t, &redistest.ClusterOptions{Args: []string{"--cluster-require-full-coverage", "no"}})
			p, logs := startCauseServer(t, cl.URL())
			logged(t, logs, "Redis checked")
			time.Sleep(200 * time.Millisecond)
			m := cl.MasterOf(t, redisHashTag(t, "api", causeLimit, "k0"))
			if tc.how == "sigstop" {
				m.Pause(t)
				defer m.Resume(t)
			} else {
				m.Kill()
			}
			logged(t, logs, "Redis Cluster master failing the service's checks", "node="+m.Addr, "cause="+tc.want)
			if got := scrapedMetric(t, p, `sluice_store_node_up{node="`+m.Addr+`"}`); got != "0" {
				t.Errorf("sluice_store_node_up for the %s master = %q, want 0", tc.how, got)
			}
			oneCause(t, p, logs, tc.want)
		})
	}
}
