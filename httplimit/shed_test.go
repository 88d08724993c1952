package httplimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
)

// The shedding test: capacity 100 in flight, 20% reserved for
// critical requests and 30% for normal ones, every priority offering 3×
// the capacity with equal hold times. At every instant sheddable requests
// hold at most 50 and sheddable plus normal at most 80, and no critical
// request is refused while fewer than 100 are in use.
var (
	shedCapacity = int64(100)
	shedReserve  = sluice.Reserve{Critical: 0.2, Normal: 0.3}
)

const shedHold = 50 * time.Millisecond

func TestShedding(t *testing.T) {
	t.Parallel()
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	runShedding(t, 3, 3*time.Second, func(sluice.Store) sluice.Store { return store }, []ShedRule{{Name: "fleet", Capacity: sluice.Concurrent(shedCapacity, time.Minute), Reserve: shedReserve}})
}

// Worker utilisation shedding: the same thresholds over one process's own
// count, no store.
func TestWorkerShedding(t *testing.T) {
	t.Parallel()
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	runShedding(t, 1, time.Second, func(sluice.Store) sluice.Store { return store }, []ShedRule{{Name: "workers", Workers: shedCapacity, Reserve: shedReserve}})
}

// On real Redis, three middlewares (a fleet's processes, each with its
// own client) share the capacity.
func TestFleetSheddingRedis(t *testing.T) {
	race.SkipTiming(t) // 900 clients: a load test, run without the detector
	t.Parallel()
	prefix := redistest.Prefix(t)
	runShedding(t, 3, 2*time.Second, func(sluice.Store) sluice.Store {
		return redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: prefix})
	}, []ShedRule{{Name: "fleet", Capacity: sluice.Concurrent(shedCapacity, time.Minute), Reserve: shedReserve}})
}

// shedRun is the handler and observer of a shedding test: it counts the
// requests of each priority in its handlers, under one lock so that every
// entry sees an exact snapshot, and the store's count at each critical
// refusal.
type shedRun struct {
	recorder
	mu       sync.Mutex
	in       [3]int64 // requests of each priority in a handler now
	max      [3]int64 // the most seen: sheddable; sheddable+normal; all
	bad      []string
	entries  int64
	served   [3]atomic.Int64
	refused  [3]atomic.Int64
	critMin  atomic.Int64 // the least in use at a critical refusal
	critDeny atomic.Int64
}

func (s *shedRun) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p, _ := sluice.ParsePriority(r.Header.Get("X-Priority"))
	s.mu.Lock()
	s.in[p]++
	s.entries++
	snap := [3]int64{s.in[2], s.in[2] + s.in[1], s.in[2] + s.in[1] + s.in[0]}
	for i, v := range snap {
		s.max[i] = max(s.max[i], v)
	}
	if snap[0] > 50 || snap[1] > 80 || snap[2] > shedCapacity {
		if len(s.bad) < 10 {
			s.bad = append(s.bad, fmt.Sprintf("entry %d: sheddable %d, +normal %d, all %d", s.entries, snap[0], snap[1], snap[2]))
		}
	}
	s.mu.Unlock()
	time.Sleep(shedHold)
	s.mu.Lock()
	s.in[p]--
	s.mu.Unlock()
}

func (s *shedRun) ObserveSlot(e sluice.SlotEvent) {
	if e.Op == sluice.SlotAcquire && e.Outcome == sluice.OutcomeDenied && e.Priority == sluice.PriorityCritical {
		s.critDeny.Add(1)
		for {
			m := s.critMin.Load()
			if m <= e.Decision.InUse || s.critMin.CompareAndSwap(m, e.Decision.InUse) {
				break
			}
		}
	}
}

// runShedding serves servers middlewares (each over the store newStore
// returns) and offers each priority 3× the capacity for run: 300 clients
// per priority, spread over the servers, each sending its next request
// when the last ends (or a hold after a refusal).
func runShedding(t *testing.T, servers int, run time.Duration, newStore func(sluice.Store) sluice.Store, shed []ShedRule) {
	s := &shedRun{}
	s.critMin.Store(1 << 62)
	prio, err := PriorityHeader("X-Priority", &PriorityOptions{TrustedProxies: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	urls := make([]string, servers)
	for i := range urls {
		m, err := New(newStore(nil), nil, &Options{Shed: shed, Priority: prio, Observer: s})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(m.Handler(s))
		t.Cleanup(srv.Close)
		urls[i] = srv.URL
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 2000, MaxIdleConnsPerHost: 1000}}
	t.Cleanup(client.CloseIdleConnections)
	deadline := time.Now().Add(run)
	var wg sync.WaitGroup
	var failed atomic.Value
	for p := range 3 {
		name := sluice.Priority(p).String()
		for c := range 3 * shedCapacity {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					req, _ := http.NewRequest("GET", urls[int(c)%servers], nil)
					req.Header.Set("X-Priority", name)
					resp, err := client.Do(req)
					if err != nil {
						failed.Store(err)
						return
					}
					resp.Body.Close()
					switch resp.StatusCode {
					case http.StatusOK:
						s.served[p].Add(1)
					case http.StatusServiceUnavailable:
						s.refused[p].Add(1)
						time.Sleep(shedHold)
					default:
						failed.Store(fmt.Errorf("status %d", resp.StatusCode))
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.bad {
		t.Error(b)
	}
	// The store counts a refused critical request's own decision exactly;
	// the handlers' count lags it, hence the tolerance of 2 slots.
	if n := s.critDeny.Load(); n > 0 && s.critMin.Load() < shedCapacity-2 {
		t.Errorf("a critical request was refused with %d in use (< %d)", s.critMin.Load(), shedCapacity)
	}
	t.Logf("most in handlers: sheddable %d, sheddable+normal %d, all %d; served/refused critical %d/%d, normal %d/%d, sheddable %d/%d; critical refusals at in-use ≥ %d",
		s.max[0], s.max[1], s.max[2], s.served[0].Load(), s.refused[0].Load(), s.served[1].Load(), s.refused[1].Load(), s.served[2].Load(), s.refused[2].Load(), s.critMin.Load())
	if s.max[2] < 50 || s.refused[2].Load() == 0 {
		t.Errorf("the load never reached the shedding regime (most in use %d, sheddable refused %d): the test proved nothing", s.max[2], s.refused[2].Load())
	}
}
