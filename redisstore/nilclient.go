package redisstore

import (
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/nilclient"
)

// orNil is nilclient.Or, shared with the service's Fleet so that both
// take the same clients for none.
func orNil(c redis.UniversalClient) redis.UniversalClient { return nilclient.Or(c) }
