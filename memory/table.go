package memory

import "github.com/sluicehq/sluice"

// tagOf is key's tag under a, from the key's hash h: its high half, which
// the shard (picked by the low bits) does not use, mixed with a, so that
// one table holds a key's states under every algorithm.
func tagOf(h uint64, a sluice.Algorithm) uint32 { return uint32(h>>32) ^ uint32(a)*0x9e3779b9 }
