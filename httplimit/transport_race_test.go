package httplimit

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// sendLog records when each request is handed to the wrapped transport.
type sendLog struct {
	base http.RoundTripper
	mu   sync.Mutex
	at   []time.Time
}

func (s *sendLog) RoundTrip(req *http.Request) (*http.Response, error) {
	now := time.Now()
	s.mu.Lock()
	s.at = append(s.at, now)
	s.mu.Unlock()
	return s.base.RoundTrip(req)
}

// delayProxy forwards TCP connections to target, holding each chunk of
// the replies for delay: a Redis a little farther away than loopback.
func delayProxy(t *testing.T, target string, delay time.Duration) string {
	t.Helper()
	addr, set := slowProxy(t, target)
	set(delay)
	return addr
}

// slowProxy is delayProxy with a delay set, from none, by set: a Redis
// that turns slow.
func slowProxy(t *testing.T, target string) (addr string, set func(time.Duration)) {
	t.Helper()
	var delay atomic.Int64
	l := redistest.Listen(t)
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	pipe := func(dst, src net.Conn, slow bool) {
		defer dst.Close()
		defer src.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if slow {
					time.Sleep(time.Duration(delay.Load()))
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	wg.Go(func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			wg.Go(func() { pipe(out, in, false) })
			wg.Go(func() { pipe(in, out, true) })
		}
	})
	return l.Addr().String(), func(d time.Duration) { delay.Store(int64(d)) }
}

// No request is handed to the base transport once a 429 with Retry-After
// has come back to its caller, until the hold ends, however many requests
// were between their quota and their send when it arrived: 64 goroutines
// against a real upstream and a real Redis, reached directly and through
// a proxy adding a millisecond to each reply.
func TestRedisTransportNoSendDuringHold(t *testing.T) {
	t.Parallel()
	for _, delay := range []time.Duration{0, time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) {
			addr := redistest.Addr(t)
			if delay > 0 {
				addr = delayProxy(t, addr, delay)
			}
			for run := range 3 {
				if n := sendsDuringHold(t, addr); n > 0 {
					t.Errorf("run %d: %d requests handed to the base transport after the 429 came back, inside its hold", run, n)
				}
			}
		})
	}
}

// sendsDuringHold runs one 429 under load and returns how many requests
// were handed on after the 429 was returned and before its hold ended.
func sendsDuringHold(t *testing.T, redisAddr string) int {
	t.Helper()
	const hold = time.Second
	var served atomic.Int64
	upstream := serveUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if served.Add(1) == 200 { // once the load runs
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	rc := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { rc.Close() })
	log := &sendLog{base: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(log.base.(*http.Transport).CloseIdleConnections)
	tr := newTransport(t, redisstore.New(rc, &redisstore.Options{Prefix: redistest.Prefix(t)}), sluice.PerSecond(1_000_000), &TransportOptions{Base: log})
	var returned atomic.Pointer[time.Time]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for {
				if r := returned.Load(); r != nil && time.Since(*r) > hold/2 {
					return
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", upstream.URL, nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests {
					now := time.Now()
					returned.Store(&now)
				}
			}
		})
	}
	wg.Wait()
	r := returned.Load()
	if r == nil {
		t.Fatal("the upstream's 429 never came back")
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	n := 0
	for _, at := range log.at {
		if at.After(*r) && at.Before(r.Add(hold-100*time.Millisecond)) {
			n++
		}
	}
	return n
}
