package enforce

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"sync"

	"github.com/sluicehq/sluice"
)

// Keyer builds store keys: Prefix + rule name + a separator + the request's
// key. Rule names cannot contain the separators, so no two rules' keys, nor
// a key and a block key, can collide:
//
//	prefix name ':' key     the key as it is
//	prefix name '#' hash    hashed: always with a secret, else when too long
//	prefix name '!' ...     a Penalty rule's block key
type Keyer struct {
	prefix string
	secret bool
	hmacs  sync.Pool
}

// NewKeyer returns a Keyer. With a non-empty secret every key is replaced
// by its HMAC-SHA-256 (truncated to 128 bits), so raw identities never
// reach the store.
func NewKeyer(prefix string, secret []byte) *Keyer {
	k := &Keyer{prefix: prefix, secret: len(secret) > 0}
	if k.secret {
		s := append([]byte(nil), secret...)
		k.hmacs.New = func() any { return hmac.New(sha256.New, s) }
	}
	return k
}

// Base returns the key stem of a rule.
func (k *Keyer) Base(rule string) string { return k.prefix + rule }

// Keys returns the store key of id under the rule with stem base and, if
// penalty, the rule's block key for id.
func (k *Keyer) Keys(base, id string, penalty bool) (key, block string) {
	sep := ":"
	switch {
	case k.secret:
		h := k.hmacs.Get().(hash.Hash)
		h.Reset()
		h.Write([]byte(id))
		var sum [sha256.Size]byte
		id = hex.EncodeToString(h.Sum(sum[:0])[:16])
		k.hmacs.Put(h)
		sep = "#"
	case len(base)+2+len(id) > sluice.MaxKeyLen:
		sum := sha256.Sum256([]byte(id))
		id = hex.EncodeToString(sum[:16])
		sep = "#"
	}
	key = base + sep + id
	if penalty {
		block = base + "!" + sep + id
	}
	return key, block
}
