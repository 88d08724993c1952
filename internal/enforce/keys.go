package enforce

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"strings"
	"sync"

	"github.com/sluicehq/sluice"
)

// KeyVersion tags every store key, so that a change of the grammar shows
// in the keys themselves. v2 is the escaped grammar below; before it the
// middleware and the service each had their own.
const KeyVersion = "v2:"

// Keyer builds store keys, in one grammar for every front end:
//
//	prefix "v2:" name ':' key        the key as it is
//	prefix "v2:" name '#' hash       hashed: always with a secret, else when too long
//	prefix "v2:" name '!' ':' key    a Penalty rule's block key ('!#' hash when hashed)
//
// The name is escaped ('%', ':', '#' and '!' become %XX), so the first of
// ':', '#' and '!' after the tag ends it, and no two distinct (rule, key)
// pairs, nor a key and a block key, share a store key. A name too long
// for its keys to fit sluice.MaxKeyLen with a hashed key is itself
// replaced by '#' and its hash (a name never holds a raw '#'), so every
// key still names its rule's stem (Stem).
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

// hashedName is the length of a hashed name: '#' and 32 hex digits.
const hashedName = 1 + 32

// Base returns the key stem of a rule: prefix, tag and escaped name, or
// the name's hash when it is too long.
func (k *Keyer) Base(rule string) string {
	var b strings.Builder
	b.Grow(len(k.prefix) + len(KeyVersion) + len(rule))
	b.WriteString(k.prefix)
	b.WriteString(KeyVersion)
	for i := 0; i < len(rule); i++ {
		switch c := rule[i]; c {
		case '%', ':', '#', '!':
			const hexDigits = "0123456789ABCDEF"
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		default:
			b.WriteByte(c)
		}
	}
	base := b.String()
	if len(base)+2+32 > sluice.MaxKeyLen {
		n := len(k.prefix) + len(KeyVersion)
		sum := sha256.Sum256([]byte(base[n:]))
		return base[:n] + "#" + hex.EncodeToString(sum[:16])
	}
	return base
}

// Stem returns the stem (Base) of the rule that key, a key from Keys,
// belongs to. ok is false for a block key and a key from another Keyer.
func (k *Keyer) Stem(key string) (stem string, ok bool) {
	n := len(k.prefix) + len(KeyVersion)
	if !strings.HasPrefix(key, k.prefix) || !strings.HasPrefix(key[len(k.prefix):], KeyVersion) {
		return "", false
	}
	if len(key) > n && key[n] == '#' { // a hashed name
		if len(key) <= n+hashedName || key[n+hashedName] == '!' {
			return "", false
		}
		return key[:n+hashedName], true
	}
	i := strings.IndexAny(key[n:], ":#!")
	if i <= 0 || key[n+i] == '!' {
		return "", false
	}
	return key[:n+i], true
}

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
