package httplimit

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// clusterClient returns a client of the Cluster SLUICE_REDIS_CLUSTER
// names, else of one of the test's own, with hook on every node's client
// (the store calls a key's master directly).
func clusterClient(t *testing.T, hook redis.Hook) *redis.ClusterClient {
	t.Helper()
	var addrs []string
	if os.Getenv("SLUICE_REDIS_CLUSTER") != "" {
		addrs = redistest.ClusterAddrs(t)
	} else {
		addrs = redistest.StartCluster(t, nil).Addrs()
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, NewClient: func(o *redis.Options) *redis.Client {
		n := redis.NewClient(o)
		n.AddHook(hook)
		return n
	}})
	t.Cleanup(func() { c.Close() })
	return c
}

// scriptKeys records how many keys each script call touches.
type scriptKeys struct {
	mu   sync.Mutex
	keys []int64
}

func (s *scriptKeys) note(cmds ...redis.Cmder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cmds {
		if a := c.Args(); len(a) > 2 && strings.HasPrefix(strings.ToLower(c.Name()), "eval") {
			if n, err := strconv.ParseInt(fmt.Sprint(a[2]), 10, 64); err == nil {
				s.keys = append(s.keys, n)
			}
		}
	}
}

func (s *scriptKeys) take() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys
	s.keys = nil
	return k
}

func (s *scriptKeys) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *scriptKeys) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.note(cmd)
		return next(ctx, cmd)
	}
}

func (s *scriptKeys) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		s.note(cmds...)
		return next(ctx, cmds)
	}
}

type tenantKey struct{}

// Request text never picks a key's Cluster slot: Route keys of a mux
// pattern's wildcard ("{id}") and client-sent braces spread over the slots
// as any key does, and layered rules are one atomic TakeAll only when the
// user's own KeyFunc gives both keys a common tag.
//
// Not parallel: its cluster's six ports are then free again before the
// parallel tests that stop and restart servers on theirs run.
func TestClusterRequestTextNoHashTag(t *testing.T) {
	hook := &scriptKeys{}
	client := clusterClient(t, hook)
	prefix := redistest.Prefix(t)
	store := redisstore.New(client, &redisstore.Options{Prefix: prefix})
	ctx := context.Background()

	serve := func(t *testing.T, rules []Rule, pattern string, reqs ...*http.Request) {
		t.Helper()
		m, err := New(store, rules, &Options{Prefix: t.Name() + ":"})
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle(pattern, m.Handler(okHandler))
		for _, r := range reqs {
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, r)
			if rec.Code != 200 {
				t.Fatalf("%s %s: %d %s", r.Method, r.URL, rec.Code, rec.Body)
			}
		}
	}
	// slots returns the slot of every key the test's rules wrote.
	slots := func(t *testing.T) map[int64][]string {
		t.Helper()
		var mu sync.Mutex
		var keys []string
		err := client.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			k, err := c.Keys(ctx, prefix+"*"+t.Name()+":*").Result()
			mu.Lock()
			keys = append(keys, k...)
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(keys)
		out := map[int64][]string{}
		for _, k := range keys {
			s, err := client.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			out[s] = append(out[s], k)
		}
		return out
	}
	get := func(path string, header ...string) *http.Request {
		r := httptest.NewRequest("GET", path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		return r
	}

	t.Run("route", func(t *testing.T) {
		rules := []Rule{{Name: "key-route", Limit: sluice.PerMinute(100), Key: Compose(Header("X-API-Key"), Route())}}
		serve(t, rules, "GET /items/{id}", get("/items/1", "X-API-Key", "bob"), get("/items/2", "X-API-Key", "alice"), get("/items/3", "X-API-Key", "carol"))
		if s := slots(t); len(s) != 3 {
			t.Errorf("the keys of three API keys on /items/{id} sit in %d slots, want 3: %v", len(s), s)
		}
	})
	t.Run("header", func(t *testing.T) {
		rules := []Rule{{Name: "key", Limit: sluice.PerMinute(100), Key: Header("X-API-Key")}}
		serve(t, rules, "/", get("/", "X-API-Key", "{x}bob"), get("/", "X-API-Key", "{x}alice"), get("/", "X-API-Key", "{x}carol"))
		if s := slots(t); len(s) != 3 {
			t.Errorf("three API keys sent as {x}…: %d slots, want 3: %v", len(s), s)
		}
	})
	t.Run("close brace", func(t *testing.T) {
		// A '}' would end the "{key}" redisstore wraps an untagged key in.
		rules := []Rule{{Name: "key", Limit: sluice.PerMinute(100), Key: Header("X-API-Key")}}
		serve(t, rules, "/", get("/", "X-API-Key", "}bob"), get("/", "X-API-Key", "}alice"), get("/", "X-API-Key", "}carol"))
		if s := slots(t); len(s) != 3 {
			t.Errorf("three API keys sent as }…: %d slots, want 3: %v", len(s), s)
		}
	})
	layered := func(t *testing.T, tenant string, rules []Rule) []int64 {
		t.Helper()
		hook.take()
		r := get("/items/1", "X-API-Key", "bob")
		if tenant != "" {
			r = r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant))
		}
		serve(t, rules, "GET /items/{id}", r)
		return hook.take()
	}
	atomic := func(calls []int64) bool {
		for _, n := range calls {
			if n == 2 {
				return true
			}
		}
		return false
	}
	t.Run("layered untagged", func(t *testing.T) {
		calls := layered(t, "", []Rule{
			{Name: "ip", Limit: sluice.PerMinute(100), Key: PeerIP()},
			{Name: "key-route", Limit: sluice.PerMinute(100), Key: Compose(Header("X-API-Key"), Route())},
		})
		if atomic(calls) {
			t.Errorf("untagged keys in one script call (keys per call %v): they should sit in two slots", calls)
		}
	})
	t.Run("layered tagged", func(t *testing.T) {
		tenant := ContextValue(tenantKey{})
		calls := layered(t, "{acme}", []Rule{
			{Name: "ip", Limit: sluice.PerMinute(100), Key: Compose(tenant, PeerIP())},
			// The user's tag after the route's: only the user's opens one.
			{Name: "key-route", Limit: sluice.PerMinute(100), Key: Compose(Header("X-API-Key"), Route(), tenant)},
		})
		if !atomic(calls) {
			t.Errorf("keys tagged {acme} by the user: script calls touched %v keys, want one call of 2 (an atomic TakeAll)", calls)
		}
		if s := slots(t); len(s) != 1 {
			t.Errorf("keys tagged {acme} sit in %d slots, want 1: %v", len(s), s)
		}
	})
}
