package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/redisstore"
)

// TestFaultCheckClusterMasterSilent: Check on a Cluster, given 5s (as
// sluice serve's start gives it), with one master of three stopped
// (SIGSTOP), then with another one's writes paused (CLIENT PAUSE WRITE),
// returns within CheckMasterTimeout of its start, not at its context's
// end: it names that master in a *PartialError (unreachable, then
// stalled), reports the two others answered and their version, whatever
// the client's own timeouts. Check waited the whole 5s for the master.
func TestFaultCheckClusterMasterSilent(t *testing.T) {
	race.SkipTiming(t)
	// The bound and a generous margin for a loaded machine; 5s, the
	// context, is far beyond.
	const within = redisstore.CheckMasterTimeout + 1500*time.Millisecond
	cl := stoppableCluster(t)
	check := func(t *testing.T, silent string, kind error) {
		t.Helper()
		for _, timed := range []bool{false, true} {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: timed})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			start := time.Now()
			rep, err := redisstore.Check(ctx, c)
			took := time.Since(start)
			cancel()
			c.Close()
			t.Logf("ContextTimeoutEnabled=%v: Check took %v: %v", timed, took.Round(time.Millisecond), err)
			if took > within {
				t.Errorf("ContextTimeoutEnabled=%v: Check took %v, want at most %v", timed, took.Round(time.Millisecond), within)
			}
			var pe *redisstore.PartialError
			if !errors.As(err, &pe) || !slices.Equal(pe.Addrs(), []string{silent}) || len(pe.Answered) != 2 || slices.Contains(pe.Answered, silent) {
				t.Errorf("ContextTimeoutEnabled=%v: Check = %v, want %s failing alone, two answered", timed, err, silent)
				continue
			}
			if !errors.Is(err, kind) || errors.Is(err, redisstore.ErrMisconfigured) {
				t.Errorf("ContextTimeoutEnabled=%v: Check = %v, want %v, nothing misconfigured", timed, err, kind)
			}
			if rep == nil || len(rep.Masters) != 3 || rep.Version == "" {
				t.Errorf("ContextTimeoutEnabled=%v: Check's report %+v, want the three masters and the others' version", timed, rep)
			}
		}
	}

	t.Run("stopped", func(t *testing.T) {
		stopped := cl.Nodes[0]
		stopped.Pause(t)
		defer stopped.Resume(t)
		check(t, stopped.Addr, redisstore.ErrUnreachable)
	})

	t.Run("writes paused", func(t *testing.T) {
		paused := cl.Nodes[1]
		admin := redis.NewClient(&redis.Options{Addr: paused.Addr})
		defer admin.Close()
		ctx := context.Background()
		if err := admin.Do(ctx, "client", "pause", 10000, "write").Err(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := admin.Do(ctx, "client", "unpause").Err(); err != nil {
				t.Error(fmt.Errorf("unpause %s: %w", paused.Addr, err))
			}
		}()
		check(t, paused.Addr, redisstore.ErrStalled)
	})
}
