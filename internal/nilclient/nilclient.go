// Package nilclient tells a Redis client that is no client: redisstore and
// the service refuse it the same way.
package nilclient

import (
	"reflect"

	"github.com/redis/go-redis/v9"
)

// Or returns nil for a nil client and for a nil pointer in a non-nil
// interface (a *redis.Client variable never assigned), which go-redis
// would dereference on the first command: on a request's path, or in a
// Cluster's background reload, where it would end the process. Any other
// client is returned as it is.
func Or(c redis.UniversalClient) redis.UniversalClient {
	if c == nil {
		return nil
	}
	if v := reflect.ValueOf(c); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil
	}
	return c
}
