package nilclient_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/nilclient"
)

func TestOr(t *testing.T) {
	for _, c := range []redis.UniversalClient{nil, (*redis.Client)(nil), (*redis.ClusterClient)(nil), (*redis.Ring)(nil)} {
		if got := nilclient.Or(c); got != nil {
			t.Errorf("Or(%T(nil)) = %v, want nil", c, got)
		}
	}
	// Built, never dialled: no Redis needed.
	node := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer node.Close()
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cluster.Close()
	for _, c := range []redis.UniversalClient{node, cluster} {
		if got := nilclient.Or(c); got != c {
			t.Errorf("Or(%T) = %v, want the client itself", c, got)
		}
	}
}
