package redisstore

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/redistest"
)

// suffixes are every suffix keyOf is given: each algorithm's code (and
// "unknown"), each with "-reset" (resetKey), and the in-flight keys'.
func suffixes() []string {
	var out []string
	for _, a := range append(sluice.Algorithms(), sluice.Algorithm(255)) {
		k := (&Store{}).redisKey("x", a)
		out = append(out, k[strings.LastIndexByte(k, ':')+1:])
	}
	for _, s := range out { // the algorithms' only: range reads out once
		out = append(out, s+"-reset")
	}
	return append(out, "if2", "if2r")
}

// storeKeys returns every Redis key s builds from key, each with what it
// holds.
func storeKeys(s *Store, key string) map[string]string {
	out := make(map[string]string)
	for _, a := range append(sluice.Algorithms(), sluice.Algorithm(255)) {
		out[s.redisKey(key, a)] = "state " + a.String()
		out[s.resetKey(key, a)] = "epoch " + a.String()
	}
	out[s.slotKey(key)] = "holders"
	out[s.releasedKey(key)] = "released"
	return out
}

// oldKey is the only layout of earlier versions.
func oldKey(prefix, key, suffix string) string { return prefix + "{" + key + "}:" + suffix }

// TestKeyLayoutInjective enumerates every key up to 7 bytes over the bytes
// that matter to the layout ('a', '{', '}', ':'): no two (key, suffix)
// pairs, tagged or not, share a Redis key; none meets a key of the old
// layout unless it is that same (untagged) key's; none meets the
// registry's or CheckAccess's keys; a tagged key's every Redis key hashes
// exactly its tag, and an untagged key's keep the old layout. The layout
// Prefix + "{" + tag + "}" + key, which also hashes the tag, is shown to
// collide, so that the enumeration is known to find collisions.
func TestKeyLayoutInjective(t *testing.T) {
	sfx := suffixes()
	if len(sfx) != 2*(len(sluice.Algorithms())+1)+2 {
		t.Fatalf("suffixes %q", sfx)
	}
	keys := []string{""}
	for n := 1; n <= 7; n++ {
		for _, k := range keys[len(keys)-pow4(n-1):] {
			for _, c := range []string{"a", "{", "}", ":"} {
				keys = append(keys, k+c)
			}
		}
	}
	keys = keys[1:] // an empty key is refused before any key is built
	for _, prefix := range []string{"", "sluice:"} {
		s := &Store{prefix: prefix}
		owner := make(map[string]string, len(keys)*len(sfx)*2)
		claim := func(redisKey, who string) {
			if o, ok := owner[redisKey]; ok && o != who {
				t.Fatalf("prefix %q: Redis key %q is both %s and %s", prefix, redisKey, o, who)
			}
			owner[redisKey] = who
		}
		claim(prefix+"check", "CheckAccess's key")
		fleet := s.Membership().Key()
		claim(fleet, "the registry")
		claim(fleet+":left", "the registry's withdrawn")
		tagged := 0
		for _, k := range keys {
			built := storeKeys(s, k)
			if len(built) != len(sfx) {
				t.Fatalf("key %q: %d distinct Redis keys, want %d", k, len(built), len(sfx))
			}
			tag, ok := tagOf(k)
			for rk, what := range built {
				claim(rk, fmt.Sprintf("%s of %q", what, k))
				suffix := rk[strings.LastIndexByte(rk, ':')+1:]
				switch {
				case !ok && rk != oldKey(prefix, k, suffix):
					t.Fatalf("untagged %q: %s is %q, want the old layout", k, what, rk)
				case ok && hashTag(rk) != tag:
					t.Fatalf("%q (tag %q): %s %q hashes %q", k, tag, what, rk, hashTag(rk))
				}
			}
			if ok {
				tagged++
			}
		}
		// Keys of the old layout left by an earlier version, tagged ones
		// included, are no key of the new one but the same untagged key's.
		for _, k := range keys {
			for _, suffix := range sfx {
				ok := oldKey(prefix, k, suffix)
				if o, found := owner[ok]; found && !strings.HasSuffix(o, fmt.Sprintf(" of %q", k)) {
					t.Fatalf("old key %q of %q is now %s", ok, k, o)
				}
			}
		}
		if tagged == 0 || tagged == len(keys) {
			t.Fatalf("%d of %d keys tagged: the enumeration misses a layout", tagged, len(keys))
		}
	}
	// The tag-first layout fails the same check: "{a}" would take the old
	// key of the untagged "a}{a".
	collides := false
	for _, k := range keys {
		tag, ok := tagOf(k)
		naive := "{" + tag + "}" + k + ":gcra"
		if !ok || !strings.HasSuffix(naive, "}:gcra") {
			continue
		}
		// naive is the old key of x: collides if x is untagged.
		x := strings.TrimSuffix(naive[1:], "}:gcra")
		if _, xt := tagOf(x); !xt && oldKey("", x, "gcra") == naive {
			collides = true
			break
		}
	}
	if !collides {
		t.Error("the enumeration found no collision in the tag-first layout")
	}
}

func pow4(n int) int { return 1 << (2 * n) }

// FuzzKeyLayout: two distinct keys never share a Redis key, and a tagged
// key's Redis keys hash its tag.
func FuzzKeyLayout(f *testing.F) {
	for _, seed := range [][2]string{
		{"{a}", "a}{a"}, {"api:{t1}:a", "{t1}:b"}, {"{t1}:b", "{{t1}:b}"}, {"a}", "[a]"},
		{"{}", "{}{a}"}, {"x]:gcra", "x"}, {"{a}]:if2", "{a}"}, {"fleet", "fleet}:left"},
	} {
		f.Add(seed[0], seed[1])
	}
	s := &Store{prefix: "sluice:"}
	f.Fuzz(func(t *testing.T, k1, k2 string) {
		if k1 == "" || k2 == "" || k1 == k2 {
			return
		}
		b1, b2 := storeKeys(s, k1), storeKeys(s, k2)
		for rk := range b1 {
			if _, ok := b2[rk]; ok {
				t.Fatalf("%q and %q share Redis key %q", k1, k2, rk)
			}
			if tag, ok := tagOf(k1); ok && hashTag(rk) != tag {
				t.Fatalf("%q: %q hashes %q, not its tag %q", k1, rk, hashTag(rk), tag)
			}
		}
		if len(b1) != len(suffixes()) {
			t.Fatalf("%q: only %d distinct Redis keys", k1, len(b1))
		}
	})
}

// scriptLog is a go-redis hook that records the script calls a client
// sends, alone or in pipelines: each one's SHA and keys.
type scriptLog struct {
	mu    sync.Mutex
	calls []scriptCall
}

type scriptCall struct {
	sha  string
	keys []string
}

// note records cmd once it ran: a call refused with NOSCRIPT is sent again.
func (l *scriptLog) note(cmd redis.Cmder) {
	args := cmd.Args()
	if cmd.Name() != "evalsha" && cmd.Name() != "eval" || len(args) < 3 || isNoScript(cmd.Err()) {
		return
	}
	n, _ := strconv.Atoi(fmt.Sprint(args[2]))
	c := scriptCall{sha: fmt.Sprint(args[1])}
	if cmd.Name() == "eval" {
		c.sha = newScript(c.sha).sha.(string)
	}
	for _, k := range args[3 : 3+n] {
		c.keys = append(c.keys, fmt.Sprint(k))
	}
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

func (l *scriptLog) take() []scriptCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.calls
	l.calls = nil
	return c
}

func (l *scriptLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *scriptLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		l.note(cmd)
		return err
	}
}

func (l *scriptLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			l.note(c)
		}
		return err
	}
}

// keySlot is the cluster's own CLUSTER KEYSLOT of key.
func keySlot(t *testing.T, c *redis.ClusterClient, key string) int64 {
	t.Helper()
	n, err := c.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// atomicTake checks that calls are one run of the TakeAll script on keys
// of one slot, and returns its keys.
func atomicTake(t *testing.T, c *redis.ClusterClient, calls []scriptCall) []string {
	t.Helper()
	if len(calls) != 1 || calls[0].sha != takeAllScript.sha || len(calls[0].keys) != 2 {
		t.Fatalf("script calls %+v: want one TakeAll script on two keys (%v)", calls, takeAllScript.sha)
	}
	k := calls[0].keys
	if a, b := keySlot(t, c, k[0]), keySlot(t, c, k[1]); a != b {
		t.Fatalf("TakeAll's keys %q in slots %d and %d", k, a, b)
	}
	return k
}

// TestClusterTaggedKeys: on a real Cluster, keys with a common hash tag
// anywhere in them (a Limiter's Prefix before it, the middleware's rule
// stem before it) share a slot, the tag's, and TakeAll takes them in one
// atomic script; two httplimit rules keyed by the same tagged key do too.
// Untagged keys keep the Redis keys of earlier versions.
func TestClusterTaggedKeys(t *testing.T) {
	ctx := context.Background()
	c := redistest.ClusterClient(t)
	var log scriptLog
	c.AddHook(&log)
	prefix := redistest.Prefix(t)
	s := New(c, &Options{Prefix: prefix})
	tagSlot := keySlot(t, c, "t1")

	// Every Redis key of the tagged keys is in the tag's slot.
	for _, k := range []string{"api:{t1}:a", "{t1}:b", "x{t1}"} {
		for rk, what := range storeKeys(s, k) {
			if got := keySlot(t, c, rk); got != tagSlot {
				t.Errorf("%q: %s %q in slot %d, want the tag's %d", k, what, rk, got, tagSlot)
			}
		}
		if got := keySlot(t, c, s.SlotKeys(k)[0]); got != tagSlot {
			t.Errorf("%q: SlotKeys in slot %d, want %d", k, got, tagSlot)
		}
	}
	// Untagged keys: the old layout, Keys and SlotKeys included.
	for _, k := range []string{"user7", "a}b", "{}x", "}{"} {
		for _, l := range []sluice.Limit{sluice.PerMinute(5), sluice.PerMinute(5).WithAlgorithm(sluice.SlidingWindowLog)} {
			want := []string{prefix + "{" + k + "}:" + algorithms[l.Algorithm].suffix}
			if got := s.Keys(k, l); len(got) != 1 || got[0] != want[0] {
				t.Errorf("Keys(%q) = %q, want %q", k, got, want)
			}
		}
		if got, want := s.SlotKeys(k), prefix+"{"+k+"}:if2"; got[0] != want {
			t.Errorf("SlotKeys(%q) = %q, want %q", k, got, want)
		}
	}

	// A Limiter's Prefix before the tag, and a key that starts with it.
	l := sluice.PerMinute(3)
	reqs := []sluice.Request{{Key: "api:{t1}:a", Limit: l, Cost: 1}, {Key: "{t1}:b", Limit: l.WithAlgorithm(sluice.TokenBucket), Cost: 1}}
	log.take()
	for i := range 4 {
		ds, err := s.TakeAll(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := ds[0].Allowed && ds[1].Allowed, i < 3; got != want {
			t.Fatalf("take %d: %+v, want allowed %v", i, ds, want)
		}
		keys := atomicTake(t, c, log.take())
		if keys[0] != s.Keys(reqs[0].Key, reqs[0].Limit)[0] || keys[1] != s.Keys(reqs[1].Key, reqs[1].Limit)[0] {
			t.Fatalf("TakeAll on %q, want the requests' Keys", keys)
		}
	}

	// Two middleware rules keyed "{t1}" by the user's own key function (a
	// header read by httplimit.Header is escaped: a client picks no tag):
	// the stems before the tag differ.
	tenant := func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil }
	m, err := httplimit.New(s, []httplimit.Rule{
		{Name: "tenant", Limit: sluice.PerMinute(2), Key: tenant},
		{Name: "burst", Limit: sluice.PerMinute(5).WithAlgorithm(sluice.TokenBucket), Key: tenant},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer srv.Close()
	for i, want := range []int{200, 200, 429} {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("X-Tenant", "{t1}")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i, resp.StatusCode, want)
		}
		if i == 0 {
			for _, k := range atomicTake(t, c, log.take()) {
				if got := keySlot(t, c, k); got != tagSlot {
					t.Errorf("middleware key %q in slot %d, want the tag's %d", k, got, tagSlot)
				}
			}
		}
	}
}
