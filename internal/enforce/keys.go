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
// in the keys themselves. v3 adds the limit's fingerprint to rate keys;
// v2 was the escaped grammar without it; before v2 the middleware and the
// service each had their own.
const KeyVersion = "v3:"

// Keyer builds store keys, in one grammar for every front end:
//
//	prefix "v3:" name '@' fp ':' key        a rate rule's key as it is
//	prefix "v3:" name '@' fp '#' hash       hashed: always with a secret, else when too long
//	prefix "v3:" name '!' ':' key           a Penalty rule's block key ('!#' hash when hashed; no fp)
//	prefix "v3:" name ':' key               an in-flight rule's key (no fp; '#' hash likewise)
//
// fp is the rule's limit's fingerprint (LimitStem): state counted under
// one limit is never read under another, which would take it for stale
// and start afresh (a reload, or instances of a fleet holding different
// limits mid-rollout, resetting each other on every request). The name is
// escaped ('%', ':', '#', '!' and '@' become %XX, and '{' and '}' too, so
// that a name never holds a Redis Cluster hash tag that would override the
// key's own), so the first of ':',
// '#', '!' and '@' after the tag ends it, and no two distinct (rule, limit,
// key) triples, nor a key and a block key, share a store key. A name too
// long for its keys to fit sluice.MaxKeyLen with a hashed key is itself
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

// fpLen is the length of a limit's fingerprint: '@' and 8 hex digits.
const fpLen = 1 + 8

// Base returns the key stem of a rule: prefix, tag and escaped name, or
// the name's hash when it is too long. In-flight rules key under it; rate
// rules under LimitStem(Base(name), limit).
func (k *Keyer) Base(rule string) string {
	var b strings.Builder
	b.Grow(len(k.prefix) + len(KeyVersion) + len(rule))
	b.WriteString(k.prefix)
	b.WriteString(KeyVersion)
	for i := 0; i < len(rule); i++ {
		switch c := rule[i]; c {
		case '%', ':', '#', '!', '@', '{', '}':
			const hexDigits = "0123456789ABCDEF"
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		default:
			b.WriteByte(c)
		}
	}
	base := b.String()
	if len(base)+fpLen+2+32 > sluice.MaxKeyLen {
		n := len(k.prefix) + len(KeyVersion)
		sum := sha256.Sum256([]byte(base[n:]))
		return base[:n] + "#" + hex.EncodeToString(sum[:16])
	}
	return base
}

// LimitStem returns the stem of a rate rule's keys under limit l: base
// (from Base) and l's fingerprint, the first 32 bits of the SHA-256 of
// l.String() (so equal limits written differently share their keys).
func (k *Keyer) LimitStem(base string, l sluice.Limit) string {
	sum := sha256.Sum256([]byte(l.String()))
	return base + "@" + hex.EncodeToString(sum[:4])
}

// Stem returns the stem (Base) of the rule that key, a key from Keys,
// belongs to, whatever the limit it counts under. ok is false for a block
// key and a key from another Keyer.
func (k *Keyer) Stem(key string) (stem string, ok bool) {
	stem, block, ok := k.parse(key)
	return stem, ok && !block
}

// RuleStem is Stem that also resolves a Penalty rule's block key to its
// rule's stem: every store key the rule's calls use.
func (k *Keyer) RuleStem(key string) (stem string, ok bool) {
	stem, _, ok = k.parse(key)
	return stem, ok
}

// parse returns the stem of key's rule and whether key is its block key.
func (k *Keyer) parse(key string) (stem string, block, ok bool) {
	n := len(k.prefix) + len(KeyVersion)
	if !strings.HasPrefix(key, k.prefix) || !strings.HasPrefix(key[len(k.prefix):], KeyVersion) {
		return "", false, false
	}
	end := n + hashedName // a hashed name
	if len(key) <= n || key[n] != '#' {
		i := strings.IndexAny(key[n:], ":#!@")
		if i <= 0 {
			return "", false, false
		}
		end = n + i
	}
	rest := end
	switch {
	case rest < len(key) && key[rest] == '@':
		rest += fpLen
	case rest < len(key) && key[rest] == '!':
		rest, block = rest+1, true
	}
	if rest >= len(key) || (key[rest] != ':' && key[rest] != '#') {
		return "", false, false // cut short
	}
	return key[:end], block, true
}

// Keys returns the store key of id under the rule with stem base (Base,
// or LimitStem for a rate rule) and, if penalty, the rule's block key for
// id.
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
		// A block names the rule, not its limit: an abuser blocked stays
		// blocked when the limit is tightened (a reload, a rollout).
		b := base
		if n := len(b) - fpLen; n > 0 && b[n] == '@' {
			b = b[:n]
		}
		block = b + "!" + sep + id
	}
	return key, block
}
