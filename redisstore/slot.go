package redisstore

import "strings"

// hashTag returns the part of key Redis Cluster hashes: the text between the
// first "{" and the next "}", if non-empty, else the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
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
