package redistest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ScriptCalls is a server's count of EVALSHA calls: a store's takes. A
// Sentinel reconfiguring a server kills its normal clients (CLIENT KILL
// TYPE normal after SLAVEOF): the question is asked again then.
func ScriptCalls(t testing.TB, c *redis.Client) int64 {
	var (
		info string
		err  error
	)
	for range 3 {
		if info, err = c.Info(context.Background(), "commandstats").Result(); err == nil {
			break
		}
	}
	if err != nil {
		t.Errorf("%s: %v", c.Options().Addr, err)
		return 0
	}
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return n
		}
	}
	return 0
}

// PromotionWatch samples, until Stop, when the first of a Sentinel set's
// replicas says it is a master (ROLE, every 2 ms) and the old master's
// script calls (every 5 ms): when a failover's promotion happened, and
// when the takes on the old master ended.
type PromotionWatch struct {
	t       testing.TB
	stop    chan struct{}
	wg      sync.WaitGroup
	roleAt  time.Time
	samples []promotionSample
}

type promotionSample struct {
	at    time.Time
	calls int64
}

// WatchPromotion starts a PromotionWatch of s's replicas and its master
// at the start.
func (s *SentinelSet) WatchPromotion(t testing.TB) *PromotionWatch {
	w := &PromotionWatch{t: t, stop: make(chan struct{})}
	client := func(addr string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	var replicas []*redis.Client
	for _, r := range s.Replicas {
		replicas = append(replicas, client(r.Addr))
	}
	old := client(s.Master.Addr)
	ctx := context.Background()
	w.wg.Go(func() {
		for w.roleAt.IsZero() {
			for _, r := range replicas {
				if role, _ := r.Do(ctx, "role").Slice(); len(role) > 0 && role[0] == "master" && w.roleAt.IsZero() {
					w.roleAt = time.Now()
				}
			}
			select {
			case <-w.stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	})
	w.wg.Go(func() {
		for {
			w.samples = append(w.samples, promotionSample{time.Now(), ScriptCalls(t, old)})
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	return w
}

// Stop ends the sampling and returns when a replica first said it was a
// master, how long after it the old master's script calls last grew, and
// how many it took since. It fails the test when no replica did.
func (w *PromotionWatch) Stop() (promoted time.Time, last time.Duration, since int64) {
	w.t.Helper()
	close(w.stop)
	w.wg.Wait()
	if w.roleAt.IsZero() {
		w.t.Fatal("no replica said it was a master")
	}
	var moved time.Time // the last sample the old master's calls grew in
	s := w.samples
	for i := 1; i < len(s); i++ {
		if s[i].calls > s[i-1].calls {
			moved = s[i].at
		}
		if !s[i].at.Before(w.roleAt) && since == 0 {
			since = s[len(s)-1].calls - s[i-1].calls
		}
	}
	return w.roleAt, moved.Sub(w.roleAt), since
}

// AnnounceConfig has sentinel adopt master as SentinelMaster's master at
// config epoch epoch, as a hello message from another Sentinel would: one
// that knows an older epoch switches at once, announcing +switch-master;
// one that knows this epoch or a newer one ignores it. The hello names a
// Sentinel at a dead address, which sentinel then lists among the others.
func (s *SentinelSet) AnnounceConfig(t testing.TB, sentinel, master *Node, epoch int64) {
	t.Helper()
	s.helloOnce.Do(func() {
		host, port, _ := net.SplitHostPort(DeadAddr(t))
		s.helloFrom = host + "," + port + "," + strings.Repeat("5", 40)
	})
	host, port, _ := net.SplitHostPort(master.Addr)
	hello := fmt.Sprintf("%s,%d,%s,%s,%s,%d", s.helloFrom, epoch, SentinelMaster, host, port, epoch)
	c := sentinel.client()
	defer c.Close()
	if err := c.Publish(context.Background(), "__sentinel__:hello", hello).Err(); err != nil {
		t.Fatalf("redistest: hello to Sentinel %s: %v", sentinel.Addr, err)
	}
}
