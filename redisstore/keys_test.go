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

// TestKeyLayoutInjective enumerates every key up to 6 bytes over the bytes
// that matter to the layout ('a', '{', '}', ':', '%'): no two (key, suffix)
// pairs, tagged or not, share a Redis key; none meets a key of the old
// layout unless it is that same (untagged) key's; none meets the
// registry's or CheckAccess's keys. Under a Prefix without "{", a tagged
// key's every Redis key hashes exactly its tag; a key with a "}" but no
// tag has moved, and its every Redis key hashes all of it, escaped (the
// old layout hashed the text before its first "}": every "user}…" key in
// one slot); any other key keeps the old layout. The layout Prefix + "{" +
// tag + "}" + key, which also hashes the tag, is shown to collide, so that
// the enumeration is known to find collisions.
func TestKeyLayoutInjective(t *testing.T) {
	sfx := suffixes()
	if len(sfx) != 2*(len(sluice.Algorithms())+1)+2 {
		t.Fatalf("suffixes %q", sfx)
	}
	alphabet := []string{"a", "{", "}", ":", "%"}
	keys := []string{""}
	for n, from := 1, 0; n <= 6; n++ {
		to := len(keys)
		for _, k := range keys[from:to] {
			for _, c := range alphabet {
				keys = append(keys, k+c)
			}
		}
		from = to
	}
	keys = keys[1:] // an empty key is refused before any key is built
	for _, prefix := range []string{"", "sluice:", "p{t}:"} {
		s := &Store{prefix: prefix}
		hashes := !strings.Contains(prefix, "{")
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
		hashedBy := map[string]string{} // a braced untagged key's hash tag: whose
		tagged, braced := 0, 0
		for _, k := range keys {
			built := storeKeys(s, k)
			if len(built) != len(sfx) {
				t.Fatalf("key %q: %d distinct Redis keys, want %d", k, len(built), len(sfx))
			}
			tag, ok := tagOf(k)
			closes := !ok && strings.Contains(k, "}")
			for rk, what := range built {
				claim(rk, fmt.Sprintf("%s of %q", what, k))
				suffix := rk[strings.LastIndexByte(rk, ':')+1:]
				switch {
				case !ok && !closes && rk != oldKey(prefix, k, suffix):
					t.Fatalf("untagged %q: %s is %q, want the old layout", k, what, rk)
				case closes && rk == oldKey(prefix, k, suffix):
					t.Fatalf("%q (a \"}\", no tag): %s is %q, the old layout", k, what, rk)
				case !hashes:
				case ok && hashTag(rk) != tag:
					t.Fatalf("%q (tag %q): %s %q hashes %q", k, tag, what, rk, hashTag(rk))
				case closes && hashTag(rk) != tagEscaper.Replace(k):
					t.Fatalf("%q (a \"}\", no tag): %s %q hashes %q, not all of the key", k, what, rk, hashTag(rk))
				}
			}
			if closes && hashes {
				h := hashTag(s.slotKey(k))
				if o, dup := hashedBy[h]; dup {
					t.Fatalf("%q and %q both hash %q", o, k, h)
				}
				hashedBy[h] = k
				if s.hashedAs(k) != s.keyOf(k, "") {
					t.Fatalf("hashedAs(%q) = %q", k, s.hashedAs(k))
				}
			}
			if ok {
				tagged++
			}
			if closes {
				braced++
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
		if tagged == 0 || braced == 0 || tagged+braced == len(keys) {
			t.Fatalf("%d tagged and %d braced of %d keys: the enumeration misses a layout", tagged, braced, len(keys))
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

// FuzzKeyLayout: two distinct keys never share a Redis key, a tagged
// key's Redis keys hash its tag, and those of a key with a "}" but no tag
// all of it.
func FuzzKeyLayout(f *testing.F) {
	for _, seed := range [][2]string{
		{"{a}", "a}{a"}, {"api:{t1}:a", "{t1}:b"}, {"{t1}:b", "{{t1}:b}"}, {"a}", "[a]"},
		{"{}", "{}{a}"}, {"x]:gcra", "x"}, {"{a}]:if2", "{a}"}, {"fleet", "fleet}:left"},
		{"a}b", "a%7Db"}, {"}", "%7D"}, {"a}b", "a%7Db}"}, {"user}1", "user}2"},
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
			tag, ok := tagOf(k1)
			if ok && hashTag(rk) != tag {
				t.Fatalf("%q: %q hashes %q, not its tag %q", k1, rk, hashTag(rk), tag)
			}
			if !ok && strings.Contains(k1, "}") && hashTag(rk) != tagEscaper.Replace(k1) {
				t.Fatalf("%q: %q hashes %q, not all of the key", k1, rk, hashTag(rk))
			}
		}
		if len(b1) != len(suffixes()) {
			t.Fatalf("%q: only %d distinct Redis keys", k1, len(b1))
		}
	})
}

// scriptLog records the script calls a client sends, alone or in
// pipelines: each one's SHA and keys.
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
// Untagged keys without a "}" keep the Redis keys of earlier versions.
func TestClusterTaggedKeys(t *testing.T) {
	ctx := context.Background()
	c := redistest.ClusterClient(t)
	var log scriptLog
	c.AddHook(redistest.AfterEach(func(cmd redis.Cmder, _ error) { log.note(cmd) }))
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
	// Untagged keys without a "}": the old layout, Keys and SlotKeys
	// included.
	for _, k := range []string{"user7", "x{y", "{"} {
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

// TestClusterBracedKeysSpread: on a real Cluster, keys with a "}" but no
// hash tag ("user}1" … "user}30") are hashed whole, so they spread over
// the masters; each key's Redis keys (every algorithm's state and epoch,
// the in-flight holders) share one slot, so a call that touches several
// (a Reset) runs as one script, for a key starting "}" too; Partition
// names the master its state is on. In the old layout
// "sluice:{user}1}:gcra" hashed "user": all 30 keys in one slot, on one
// master; and "sluice:{}a}:gcra" hashed whole, each key in a slot of its
// own (Reset: CROSSSLOT).
func TestClusterBracedKeysSpread(t *testing.T) {
	ctx := context.Background()
	c := redistest.ClusterClient(t)
	s := New(c, &Options{Prefix: redistest.Prefix(t)})
	l := sluice.PerMinute(5)
	masters := map[string]int{}
	keys := []string{"}", "}a", "{}x", "a}b{"}
	for i := 1; i <= 30; i++ {
		keys = append(keys, fmt.Sprint("user}", i))
	}
	for _, k := range keys {
		if _, err := s.Take(ctx, k, l, 1); err != nil {
			t.Fatalf("Take(%q): %v", k, err)
		}
		if err := s.Reset(ctx, k, l); err != nil {
			t.Fatalf("Reset(%q): %v", k, err)
		}
		slot := keySlot(t, c, s.SlotKeys(k)[0])
		for rk, what := range storeKeys(s, k) {
			if got := keySlot(t, c, rk); got != slot {
				t.Fatalf("%q: %s %q in slot %d, its holders' in %d", k, what, rk, got, slot)
			}
		}
		node, err := c.MasterForKey(ctx, s.Keys(k, l)[0])
		if err != nil {
			t.Fatal(err)
		}
		addr := node.Options().Addr
		if p := s.Partition(k); p != addr {
			t.Errorf("Partition(%q) = %q, want %q", k, p, addr)
		}
		if strings.HasPrefix(k, "user}") {
			masters[addr]++
		}
	}
	var all sync.Map
	if err := c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
		all.Store(m.Options().Addr, true)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	n := 0
	all.Range(func(any, any) bool { n++; return true })
	if n < 2 || len(masters) != n {
		t.Errorf("30 keys user}1…user}30 on %d of %d masters: %v", len(masters), n, masters)
	}
	t.Logf("30 keys over the masters: %v", masters)
}

// TestSlot checks the hash slot computation against the cluster's own
// CLUSTER KEYSLOT.
func TestSlot(t *testing.T) {
	c := redistest.ClusterClient(t)
	s := New(c, nil)
	keys := []string{"", "a", "foo", "123456789", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}"}
	for _, a := range sluice.Algorithms() {
		keys = append(keys, s.redisKey("k", a), s.redisKey("}x", a), s.redisKey("{tenant}:u", a), s.redisKey("api:{tenant}:u", a))
	}
	for _, k := range keys {
		want, err := c.ClusterKeySlot(context.Background(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := slot(k); int64(got) != want {
			t.Errorf("slot(%q) = %d, want %d", k, got, want)
		}
	}
}

func TestOneSlot(t *testing.T) {
	key := func(k string) string { return New(nil, nil).redisKey(k, sluice.GCRA) }
	together := []string{key("{t}:a"), key("api:{t}:b")}
	apart := []string{key("user"), key("ip")}
	if slot(apart[0]) == slot(apart[1]) {
		t.Fatal("pick keys in different slots")
	}
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
		keys   []string
		want   bool
	}{
		{"standalone", &redis.Client{}, apart, true},
		{"cluster apart", &redis.ClusterClient{}, apart, false},
		{"cluster tagged", &redis.ClusterClient{}, together, true},
		{"ring apart", &redis.Ring{}, apart, false},
		{"ring tagged", &redis.Ring{}, together, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := New(tc.client, nil).oneSlot(tc.keys); got != tc.want {
				t.Errorf("oneSlot = %v, want %v", got, tc.want)
			}
		})
	}
}
