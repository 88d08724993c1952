package redisstore

import (
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
