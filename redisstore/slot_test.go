package redisstore

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

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
