package redisstore

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// groupOf returns the function that names the group of a key on client:
// keys of one group may be touched by one script. On a standalone or
// Sentinel client (one server) every key is in one group; on a Cluster a
// key's group is its hash slot; on a Ring or unknown sharding, only a
// common hash tag is safe.
func groupOf(client redis.UniversalClient) func(key string) string {
	switch client.(type) {
	case *redis.Client:
		return func(string) string { return "" }
	case *redis.ClusterClient:
		return func(key string) string { return strconv.Itoa(int(slot(key))) }
	default:
		return hashTag
	}
}

// hashTag returns the part of key Redis Cluster hashes: its tag (tagOf) if
// it has one, else the whole key.
func hashTag(key string) string {
	if tag, ok := tagOf(key); ok {
		return tag
	}
	return key
}

// tagOf returns key's hash tag as Redis Cluster defines it: the text between
// the first "{" and the next "}", if non-empty. ok is false for a key
// without one, which Redis hashes whole.
func tagOf(key string) (tag string, ok bool) {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j], true
		}
	}
	return "", false
}

// slot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag, modulo 16384.
func slot(key string) uint16 {
	var crc uint16
	tag := hashTag(key)
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}

// Partition implements sluice.Partitioner. On a ClusterClient it names the
// master that owns key's hash slot in the client's slot map, by its
// address, as go-redis routes key's calls: a circuit breaker kept per
// master (package resilient) then stops calling a master that is down
// while the others go on deciding. It answers from memory: "" until a call
// or a reload has loaded the map, and on a standalone or Sentinel client
// (one server) or any other client.
func (s *Store) Partition(key string) string {
	if s == nil || s.reload == nil || !s.reload.mapped.Load() {
		return ""
	}
	node, err := s.reload.cluster.MasterForKey(context.Background(), s.hashedAs(key))
	if err != nil {
		return ""
	}
	return node.Options().Addr
}

// hashedAs returns a string in the hash slot of key's Redis keys: key
// itself where Redis hashes the same part of both (no "{" in Prefix, and a
// key with a hash tag or no "}"), else one of those keys.
func (s *Store) hashedAs(key string) string {
	if strings.IndexByte(s.prefix, '{') < 0 {
		if _, tagged := tagOf(key); tagged || strings.IndexByte(key, '}') < 0 {
			return key
		}
	}
	return s.keyOf(key, "")
}
