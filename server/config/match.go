package config

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/internal/ipkey"
)

// Domain is one Envoy rate-limit domain: envoyproxy/ratelimit's descriptor
// tree, plus sluice-format policies whose key templates descriptors fill.
type Domain struct {
	name     string
	root     *descNode
	policies []*Policy          // sluice-format policies in this domain
	bySig    map[string]*Policy // explicit key templates by sorted variable list
}

// entryKey is a descriptor entry as configured: key and optional value. A
// value ending in "*" is a prefix wildcard. Keeping key and value apart
// (envoyproxy/ratelimit joins them with "_") means key "a" value "b_c" and
// key "a_b" value "c" can never be confused.
type entryKey struct{ key, value string }

type descNode struct {
	children       map[entryKey]*descNode
	wildcards      []wildcard // children with wildcard values, in file order
	rule           *RateLimit
	shareThreshold bool
	// ipGroup, from ipv6_prefix, keys this entry's value by its address
	// group when it is an IP address; nil keys it as sent.
	ipGroup    *ipkey.Resolver
	ipv6Prefix int
	pos        pos
}

// RateLimit is an Envoy rate_limit block.
type RateLimit struct {
	// Policy is the block's limit; nil when Unlimited or Blocked.
	Policy    *Policy
	Unlimited bool
	// Blocked: requests_per_unit 0, every hit is over the limit.
	Blocked bool
	// Period is the window: the unit times unit_multiplier.
	Period time.Duration
	// Unit is the unit as written, which Envoy's responses name.
	Unit time.Duration
	// Shadow: shadow_mode or quota_mode, never over the limit; Quota
	// says which was written, for check-config's listing.
	Shadow   bool
	Quota    bool
	Name     string
	Replaces []string
	// Path is the descriptor path the block sits at, as envoyproxy/ratelimit
	// names its stats ("domain.key_value.key").
	Path string
}

// wildcard is a child whose value holds '*': each matches any run of
// characters, as in envoyproxy/ratelimit ("/api/*", "/api*v1").
type wildcard struct {
	entryKey
	parts []string // the value split at each '*'
}

func newWildcard(ek entryKey) wildcard {
	return wildcard{ek, strings.Split(ek.value, "*")}
}

// match reports whether value matches the pattern: the literal parts in
// order, the first at the start and the last at the end.
func (w wildcard) match(value string) bool {
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if !strings.HasPrefix(value, first) {
		return false
	}
	value = value[len(first):]
	for _, p := range w.parts[1 : len(w.parts)-1] {
		i := strings.Index(value, p)
		if i < 0 {
			return false
		}
		value = value[i+len(p):]
	}
	return strings.HasSuffix(value, last)
}

// Entry is one key/value pair of a descriptor.
type Entry struct{ Key, Value string }

// Match is what one request descriptor resolved to: an Envoy rate_limit
// block, or a sluice-format policy.
type Match struct {
	// RateLimit is set for Envoy-format matches.
	RateLimit *RateLimit
	// Policy is set for sluice-format matches.
	Policy *Policy
	// Key is the state key within the policy: the descriptor's entries
	// (share_threshold values replaced by their pattern), or the policy's
	// rendered key template.
	Key string
}

// Match finds what answers a descriptor: an Envoy rate_limit block first,
// else a sluice-format policy.
func (d *Domain) Match(entries []Entry) (Match, bool) {
	if m, ok := d.lookup(entries); ok {
		return m, true
	}
	return d.lookupPolicy(entries)
}

// lookup finds the rule for a descriptor exactly as envoyproxy/ratelimit's
// GetLimit does: level by level, key+value first, then wildcard values in
// file order, then the key alone. Only a rule at the descriptor's last
// entry applies; a request with more entries than the tree is deep, or
// one that stops above a rule, matches nothing.
func (d *Domain) lookup(entries []Entry) (Match, bool) {
	node := d.root
	var shared []string // per entry, a value keyed in its place: a share_threshold pattern or an address group
	for i, e := range entries {
		next := node.children[entryKey{e.Key, e.Value}]
		if next == nil {
			for _, w := range node.wildcards {
				if w.key == e.Key && w.match(e.Value) {
					next = node.children[w.entryKey]
					if next.shareThreshold {
						if shared == nil {
							shared = make([]string, len(entries))
						}
						shared[i] = w.value
					}
					break
				}
			}
		}
		if next == nil {
			next = node.children[entryKey{key: e.Key}]
		}
		if next == nil {
			return Match{}, false
		}
		if g, ok := groupIP(next.ipGroup, e.Value); ok && (shared == nil || shared[i] == "") {
			if shared == nil {
				shared = make([]string, len(entries))
			}
			shared[i] = g
		}
		if i == len(entries)-1 {
			if next.rule == nil {
				return Match{}, false
			}
			return Match{RateLimit: next.rule, Key: entriesKey(entries, shared)}, true
		}
		if len(next.children) == 0 {
			return Match{}, false
		}
		node = next
	}
	return Match{}, false
}

// groupIP returns the address group value is keyed by under r (from
// ipv6_prefix): ok is false without r, or when value is not an IP
// address. Only an address as Envoy's remote_address sends it is grouped:
// no port or brackets. A group's own key (2001:db8:1:2::/64) is itself,
// however written (upper case, unmasked), so that it names one counter.
func groupIP(r *ipkey.Resolver, value string) (string, bool) {
	if r == nil {
		return "", false
	}
	if a, err := netip.ParseAddr(value); err == nil {
		return r.Key(a), true
	}
	if p, err := netip.ParsePrefix(value); err == nil {
		return r.PrefixKey(p)
	}
	return "", false
}

// routingEntry is the entry key that, first in a descriptor, names the
// policy; no key template may use it as a variable.
const routingEntry = "policy"

// lookupPolicy finds a sluice-format policy for a descriptor: either one
// whose key template's variables are exactly the entries' keys, or one
// named by a leading ("policy", NAME) entry whose other entries fill its
// template. In-flight policies are never found: a descriptor naming one
// is unmatched, as Envoy has no call to release a slot.
func (d *Domain) lookupPolicy(entries []Entry) (Match, bool) {
	if len(entries) > 0 && entries[0].Key == routingEntry {
		for _, p := range d.policies {
			if p.Name == entries[0].Value && p.InFlight == nil {
				if key, ok := p.tmpl.render(entries[1:], p.ipGroup); ok {
					return Match{Policy: p, Key: key}, true
				}
				return Match{}, false
			}
		}
		return Match{}, false
	}
	if len(d.bySig) == 0 {
		return Match{}, false
	}
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = e.Key
	}
	sort.Strings(keys)
	p := d.bySig[strings.Join(keys, "\x00")]
	if p == nil {
		return Match{}, false
	}
	key, ok := p.tmpl.render(entries, p.ipGroup)
	if !ok {
		return Match{}, false
	}
	return Match{Policy: p, Key: key}, true
}

// EntriesKey renders descriptor entries as a state key:
// "key=value,key=value", with '%', ',', '=' and '|' escaped so that no two
// descriptors share a key, and '{' and '}' so that none picks its slot.
func EntriesKey(entries []Entry) string { return entriesKey(entries, nil) }

// Reaches reports whether a descriptor reaches key under p, so that a
// counter made through the JSON API is one Envoy's requests share: any key
// for a sluice-format policy, and for an Envoy-format one only a key
// written as its descriptor's entries (as EntriesKey writes them) that the
// domain's tree matches to p.
//
// Under ipv6_prefix the key must be the grouped one: a key that names one
// address of a group (or a group written another way) is a counter no
// Envoy request shares.
//
// A key with a raw brace, a '%' that is not an escape, or an escape its
// rendering never writes (%41 for "A") is one no descriptor renders
// (KeyEscapeProblem says why).
func (c *Config) Reaches(p *Policy, key string) bool {
	if !p.envoy {
		if p.KeyEscapeProblem(key) != "" {
			return false
		}
		_, regrouped := p.regroup(key)
		return !regrouped
	}
	counted, ok := c.CountedKey(p, key)
	return ok && counted == key
}

// CountedKey returns the key Envoy's requests count under when their
// descriptor is the one an Envoy-format policy's key writes: the key
// itself, or with a value grouped (ipv6_prefix). For a sluice-format
// policy it is the key with its template's values grouped, ok only when
// that changes it. ok is false when no such descriptor reaches p.
func (c *Config) CountedKey(p *Policy, key string) (string, bool) {
	if !p.envoy {
		return p.regroup(key)
	}
	d := c.domains[p.Domain]
	if d == nil {
		return "", false
	}
	var entries []Entry
	for _, part := range strings.Split(key, ",") {
		k, v, ok := strings.Cut(part, "=")
		k, okk := unescape(k)
		v, okv := unescape(v)
		if !ok || !okk || !okv {
			return "", false
		}
		entries = append(entries, Entry{k, v})
	}
	m, ok := d.lookup(entries)
	if !ok || m.RateLimit.Policy != p {
		return "", false
	}
	return m.Key, true
}

// EscapeProblem says what is wrong with the %-escapes of a key, written
// as descriptor entries or as a rendered key template, "" when nothing is:
// both write each escape as '%' and two upper-case hex digits, and every
// '{' and '}' escaped, and Reaches matches only that form.
func EscapeProblem(key string) string {
	if i := strings.IndexAny(key, "{}"); i >= 0 {
		return fmt.Sprintf("a %q in a key is written %%%02X (a value's braces are escaped, so that no client picks its key's Redis Cluster slot)", key[i], key[i])
	}
	for i := 0; i < len(key); i++ {
		if key[i] != '%' {
			continue
		}
		if i+2 >= len(key) || !isHex(key[i+1]) || !isHex(key[i+2]) {
			esc := key[i:min(i+3, len(key))]
			return fmt.Sprintf("%q is not an escape: write a '%%' of the key's text as %%25", esc)
		}
		if esc := key[i : i+3]; esc != strings.ToUpper(esc) {
			return fmt.Sprintf("escape %q must be written in upper case, %q", esc, strings.ToUpper(esc))
		}
		i += 2
	}
	return ""
}

// KeyEscapeProblem says what is wrong with key's escapes as a key of p,
// "" when nothing is: EscapeProblem's syntax, and then every escape one
// that p's keys are rendered with there, so that no second spelling of a
// key (%41 for "A") makes a counter of its own that no descriptor
// reaches. The problem names the key to send. A key that does not fit
// p's template at all is held to the escapes every value has.
func (p *Policy) KeyEscapeProblem(key string) string {
	if why := EscapeProblem(key); why != "" {
		return why
	}
	canon, rule := p.canonical(key)
	if canon == key {
		return ""
	}
	i := 0
	for i < len(key) && i < len(canon) && key[i] == canon[i] {
		i++
	}
	what := fmt.Sprintf("%q is not an escape", key[i:min(i+3, len(key))])
	if i < len(key) && key[i] != '%' {
		what = fmt.Sprintf("a %q is written %%%02X", key[i], key[i])
	}
	return fmt.Sprintf("%s here: %s; send %q", what, rule, canon)
}

// canonical returns key with its values written as p's keys render them,
// and the rule it follows; key itself when it has none to compare (an
// Envoy-format key not written as entries).
func (p *Policy) canonical(key string) (string, string) {
	if p.envoy {
		const rule = "an entry's key and value escape only '%', ',', '=', '|', '{' and '}' (%25, %2C, %3D, %7C, %7B, %7D)"
		var b strings.Builder
		for i, part := range strings.Split(key, ",") {
			k, v, ok := strings.Cut(part, "=")
			k, okk := unescape(k)
			v, okv := unescape(v)
			if !ok || !okk || !okv {
				return key, rule
			}
			if i > 0 {
				b.WriteByte(',')
			}
			escapeTo(&b, k)
			b.WriteByte('=')
			escapeTo(&b, v)
		}
		return b.String(), rule
	}
	rule := "a value escapes only '%', '{' and '}' (%25, %7B, %7D)"
	t := p.tmpl
	if t == nil {
		return onlyKeyEscapes(key), rule
	}
	if len(t.vars) > 1 {
		rule += ", and one before the template's last variable the text between its variables too"
	}
	raws, ok := t.split(key)
	if !ok {
		return onlyKeyEscapes(key), rule
	}
	var b strings.Builder
	b.WriteString(t.parts[0])
	for i, raw := range raws {
		v, ok := unescape(raw)
		if !ok {
			return key, rule
		}
		t.writeValueAt(&b, i, v)
		b.WriteString(t.parts[i+1])
	}
	return b.String(), rule
}

// onlyKeyEscapes returns key with every escape but %25, %7B and %7D (the
// ones enforce.EscapeKey writes) undone.
func onlyKeyEscapes(key string) string {
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		if key[i] != '%' || i+2 >= len(key) {
			b.WriteByte(key[i])
			continue
		}
		switch esc := key[i+1 : i+3]; esc {
		case "25", "7B", "7D":
			b.WriteString(key[i : i+3])
		default:
			n, err := strconv.ParseUint(esc, 16, 8)
			if err != nil {
				b.WriteByte(key[i])
				continue
			}
			b.WriteByte(byte(n))
		}
		i += 2
	}
	return b.String()
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

// unescape undoes escapeTo.
func unescape(s string) (string, bool) {
	if !strings.Contains(s, "%") {
		return s, true
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		n, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", false
		}
		b.WriteByte(byte(n))
		i += 2
	}
	return b.String(), true
}

// writeValue writes a variable's value, escaped as t.escape says.
func (t *template) writeValue(b *strings.Builder, v string) {
	for i := 0; i < len(v); i++ {
		if c := v[i]; t.escape[c] {
			fmt.Fprintf(b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
}

// writeValueAt writes v as the template renders its i-th value: the last
// with the escapes every key value has (enforce.EscapeKey), the others
// with the text between the variables escaped too.
func (t *template) writeValueAt(b *strings.Builder, i int, v string) {
	if i == len(t.vars)-1 {
		b.WriteString(enforce.EscapeKey(v))
	} else {
		t.writeValue(b, v)
	}
}

func entriesKey(entries []Entry, shared []string) string {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte(',')
		}
		escapeTo(&b, e.Key)
		b.WriteByte('=')
		v := e.Value
		if shared != nil && shared[i] != "" {
			v = shared[i]
		}
		escapeTo(&b, v)
	}
	return b.String()
}

// escapeTo writes s with '%', ',', '=' and '|' percent-escaped, so that
// entries read back unambiguously, and '{' and '}', so that no client's
// value makes a Redis Cluster hash tag of its key (see template).
func escapeTo(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', ',', '=', '|', '{', '}':
			fmt.Fprintf(b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
}

// template is a key template: literal text and {variables}.
//
// Every value is written with '%', '{' and '}' percent-escaped
// (enforce.EscapeKey): the template's own braces are its variables, so
// any brace in a rendered key would be a client's, opening a Redis
// Cluster hash tag (or ending the one redisstore wraps a key in) and so
// choosing the key's slot.
type template struct {
	parts []string // literal, variable, literal, variable, ..., literal
	vars  []string
	// escape is, for a template of two variables or more, '%', '{', '}'
	// and every byte of the literal text between variables: percent-escaped
	// in the values of every variable but the last, so that no two
	// descriptors render one key ("{user}:{ip}" with user "a:b" and ip "c"
	// is "a%3Ab:c", not user "a" and ip "b:c"'s "a:b:c"). Reading a key
	// from the left, each escaped value then ends where the next text
	// begins (the text holds no '%', so no escape can be mistaken for it);
	// the last value is what remains, so it needs only the escapes every
	// value has, and an IPv6 address in last place stays as it is.
	escape [256]bool
}

func parseTemplate(s string) (*template, error) {
	t := &template{}
	rest := s
	for {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			if strings.IndexByte(rest, '}') >= 0 {
				return nil, fmt.Errorf("unmatched '}'")
			}
			t.parts = append(t.parts, rest)
			break
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return nil, fmt.Errorf("unclosed '{'")
		}
		name := rest[open+1 : open+end]
		if len(name) > maxVarLen {
			return nil, fmt.Errorf("variable {%.16s…} is %d bytes long: at most %d", name, len(name), maxVarLen)
		}
		if !validVar(name) {
			return nil, fmt.Errorf("variable {%s}: use letters, digits, '.', '_' and '-'", name)
		}
		for _, v := range t.vars {
			if v == name {
				return nil, fmt.Errorf("variable {%s} appears twice", name)
			}
		}
		if strings.IndexByte(rest[:open], '}') >= 0 {
			return nil, fmt.Errorf("unmatched '}'")
		}
		t.parts = append(t.parts, rest[:open])
		t.vars = append(t.vars, name)
		rest = rest[open+end+1:]
	}
	if len(t.vars) == 0 {
		return nil, fmt.Errorf("needs at least one {variable}")
	}
	// A rendered key's '%' starts an escape: a raw one in the text around
	// the variables would render keys the JSON API cannot name.
	for _, lit := range []string{t.parts[0], t.parts[len(t.parts)-1]} {
		if why := EscapeProblem(lit); why != "" {
			return nil, fmt.Errorf("the text around its variables: %s", why)
		}
	}
	if len(t.vars) > 1 {
		for i, lit := range t.parts[1 : len(t.parts)-1] {
			if lit == "" || strings.IndexByte(lit, '%') >= 0 {
				return nil, fmt.Errorf("variables {%s} and {%s} need text between them without '%%', or their values could not be told apart", t.vars[i], t.vars[i+1])
			}
		}
		t.escape['%'], t.escape['{'], t.escape['}'] = true, true, true
		for _, lit := range t.parts[1 : len(t.parts)-1] {
			for i := 0; i < len(lit); i++ {
				t.escape[lit[i]] = true
			}
		}
	}
	return t, nil
}

// maxVarLen bounds a template variable's name.
const maxVarLen = 128

// validVar reports whether s can name a template variable (a descriptor
// entry key).
func validVar(s string) bool {
	if s == "" || len(s) > maxVarLen {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func (t *template) signature() string {
	v := append([]string(nil), t.vars...)
	sort.Strings(v)
	return strings.Join(v, "\x00")
}

// render fills the template from entries, which must supply every variable
// exactly once and nothing else; a value that is an IP address is keyed
// by its group under group (nil: as sent).
func (t *template) render(entries []Entry, group *ipkey.Resolver) (string, bool) {
	if len(entries) != len(t.vars) {
		return "", false
	}
	var b strings.Builder
	for i, v := range t.vars {
		b.WriteString(t.parts[i])
		found := false
		for _, e := range entries {
			if e.Key != v {
				continue
			}
			value := e.Value
			if g, ok := groupIP(group, value); ok {
				value = g
			}
			t.writeValueAt(&b, i, value)
			found = true
			break
		}
		if !found {
			return "", false
		}
	}
	b.WriteString(t.parts[len(t.parts)-1])
	return b.String(), true
}

// regroup returns key as the policy's descriptors render it when its
// template's values are grouped (ipv6_prefix): ok only when that differs
// from key. A key that does not fit the template is left alone.
func (p *Policy) regroup(key string) (string, bool) {
	if p.ipGroup == nil || p.tmpl == nil {
		return "", false
	}
	t := p.tmpl
	raws, ok := t.split(key)
	if !ok {
		return "", false
	}
	var b strings.Builder
	b.WriteString(t.parts[0])
	changed := false
	for i, raw := range raws {
		value, ok := unescape(raw)
		if !ok {
			return "", false
		}
		if g, ok := groupIP(p.ipGroup, value); ok && g != value {
			t.writeValueAt(&b, i, g)
			changed = true
		} else {
			b.WriteString(raw)
		}
		b.WriteString(t.parts[i+1])
	}
	if !changed {
		return "", false
	}
	return b.String(), true
}

// split returns key's values as written (escaped) when key fits t, its
// literal text in place: ok false when it does not.
func (t *template) split(key string) ([]string, bool) {
	rest, ok := strings.CutPrefix(key, t.parts[0])
	if !ok {
		return nil, false
	}
	raws := make([]string, len(t.vars))
	last := len(t.vars) - 1
	for i := range t.vars {
		// Values but the last hold no byte of the text after them
		// (escaped), so each ends where that text first appears outside
		// an escape (the text may hold hex digits: "{a}0{b}").
		if i < last {
			j := indexOutsideEscapes(rest, t.parts[i+1])
			if j < 0 {
				return nil, false
			}
			raws[i], rest = rest[:j], rest[j+len(t.parts[i+1]):]
		} else {
			suffix := t.parts[i+1]
			if !strings.HasSuffix(rest, suffix) {
				return nil, false
			}
			raws[i] = rest[:len(rest)-len(suffix)]
		}
	}
	return raws, true
}

// indexOutsideEscapes is strings.Index(s, sub) for a sub that starts
// with no '%', skipping the %XX escapes of s.
func indexOutsideEscapes(s, sub string) int {
	for i := 0; i < len(s); i++ {
		if s[i] == '%' {
			i += 2
			continue
		}
		if strings.HasPrefix(s[i:], sub) {
			return i
		}
	}
	return -1
}
