package server

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// domain is one Envoy rate-limit domain: envoyproxy/ratelimit's descriptor
// tree, plus sluice-format policies whose key templates descriptors fill.
type domain struct {
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
	wildcards      []entryKey // children with wildcard values, in file order
	rule           *rule
	shareThreshold bool
	pos            pos
}

// rule is an Envoy rate_limit block.
type rule struct {
	policy    *Policy // nil when unlimited or blocked
	unlimited bool
	blocked   bool          // requests_per_unit: 0: every hit is over the limit
	period    time.Duration // the unit, for blocked rules' reset time
	shadow    bool
	name      string
	replaces  []string
}

// Entry is one key/value pair of a descriptor.
type Entry struct{ Key, Value string }

// match is what one request descriptor resolved to.
type match struct {
	rule *rule
	// key is the rule's state key within its policy: the descriptor's
	// entries, with share_threshold values replaced by their pattern.
	key string
	// policy is set for sluice-format matches (rule is nil then).
	policy *Policy
}

// lookup finds the rule for a descriptor exactly as envoyproxy/ratelimit's
// GetLimit does: level by level, key+value first, then wildcard values in
// file order, then the key alone. Only a rule at the descriptor's last
// entry applies; a request with more entries than the tree is deep, or
// one that stops above a rule, matches nothing.
func (d *domain) lookup(entries []Entry) (match, bool) {
	node := d.root
	var shared []string // share_threshold pattern per entry, if any
	for i, e := range entries {
		next := node.children[entryKey{e.Key, e.Value}]
		if next == nil {
			for _, w := range node.wildcards {
				if w.key == e.Key && strings.HasPrefix(e.Value, strings.TrimSuffix(w.value, "*")) {
					next = node.children[w]
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
			return match{}, false
		}
		if i == len(entries)-1 {
			if next.rule == nil {
				return match{}, false
			}
			return match{rule: next.rule, key: entriesKey(entries, shared)}, true
		}
		if len(next.children) == 0 {
			return match{}, false
		}
		node = next
	}
	return match{}, false
}

// lookupPolicy finds a sluice-format policy for a descriptor: either one
// whose key template's variables are exactly the entries' keys, or one
// named by a leading ("policy", NAME) entry whose other entries fill its
// template.
func (d *domain) lookupPolicy(entries []Entry) (match, bool) {
	if len(entries) > 0 && entries[0].Key == "policy" {
		for _, p := range d.policies {
			if p.Name == entries[0].Value {
				if key, ok := p.tmpl.render(entries[1:]); ok {
					return match{policy: p, key: key}, true
				}
				return match{}, false
			}
		}
		return match{}, false
	}
	if len(d.bySig) == 0 {
		return match{}, false
	}
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = e.Key
	}
	sort.Strings(keys)
	p := d.bySig[strings.Join(keys, "\x00")]
	if p == nil {
		return match{}, false
	}
	key, ok := p.tmpl.render(entries)
	if !ok {
		return match{}, false
	}
	return match{policy: p, key: key}, true
}

// entriesKey renders descriptor entries as a state key:
// "key=value,key=value", with '%', ',' and '=' escaped so that no two
// descriptors share a key.
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

func escapeTo(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', ',', '=', '|':
			fmt.Fprintf(b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
}

func (n *descNode) describe(w io.Writer, indent string) {
	keys := make([]entryKey, 0, len(n.children))
	for k := range n.children {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return n.children[keys[i]].pos.line < n.children[keys[j]].pos.line
	})
	for _, k := range keys {
		c := n.children[k]
		fmt.Fprintf(w, "%s%s", indent, k.key)
		if k.value != "" {
			fmt.Fprintf(w, "=%s", k.value)
		}
		if r := c.rule; r != nil {
			switch {
			case r.unlimited:
				fmt.Fprint(w, ": unlimited")
			case r.blocked:
				fmt.Fprintf(w, ": blocked (0 per %v)", r.period)
			default:
				fmt.Fprintf(w, ": %s", r.policy.Limit)
			}
			if r.shadow {
				fmt.Fprint(w, ", shadow_mode")
			}
			if r.name != "" {
				fmt.Fprintf(w, ", name %s", r.name)
			}
			if len(r.replaces) > 0 {
				fmt.Fprintf(w, ", replaces %s", strings.Join(r.replaces, ", "))
			}
		}
		if c.shareThreshold {
			fmt.Fprint(w, ", share_threshold")
		}
		fmt.Fprintln(w)
		c.describe(w, indent+"  ")
	}
}

// template is a key template: literal text and {variables}.
type template struct {
	parts []string // literal, variable, literal, variable, ..., literal
	vars  []string
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
		if !validName(name) {
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
	return t, nil
}

func (t *template) signature() string {
	v := append([]string(nil), t.vars...)
	sort.Strings(v)
	return strings.Join(v, "\x00")
}

// render fills the template from entries, which must supply every variable
// exactly once and nothing else.
func (t *template) render(entries []Entry) (string, bool) {
	if len(entries) != len(t.vars) {
		return "", false
	}
	var b strings.Builder
	for i, v := range t.vars {
		b.WriteString(t.parts[i])
		found := false
		for _, e := range entries {
			if e.Key == v {
				b.WriteString(e.Value)
				found = true
				break
			}
		}
		if !found {
			return "", false
		}
	}
	b.WriteString(t.parts[len(t.parts)-1])
	return b.String(), true
}
