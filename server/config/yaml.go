package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/enforce"
)

// The strict YAML reader: every field known, none twice, every value of the
// kind it should be, every error with its file:line:column. Both formats
// read through it.

// pos is a position in a config file.
type pos struct {
	file      string
	line, col int
}

func (p pos) String() string { return fmt.Sprintf("%s:%d", p.file, p.line) }

const maxConfigErrors = 20

type loader struct {
	file   string
	errs   []error
	cfg    *Config
	domPos map[string]pos
	// implicitDefault: the default domain was made by policies naming no
	// domain, so more such policies join it.
	implicitDefault bool
	// reading holds the mappings and descriptor lists being read: an alias
	// to one of them inside it would be read forever.
	reading map[*yaml.Node]bool
	// read holds the descriptors read; repeats counts those read again
	// through an alias, which maxRepeats bounds.
	read    map[*yaml.Node]bool
	repeats int
}

func newLoader() *loader {
	return &loader{
		cfg:     &Config{byName: map[string]*Policy{}, domains: map[string]*Domain{}},
		domPos:  map[string]pos{},
		reading: map[*yaml.Node]bool{},
		read:    map[*yaml.Node]bool{},
	}
}

func (l *loader) errorf(n *yaml.Node, format string, args ...any) {
	if len(l.errs) >= maxConfigErrors {
		return
	}
	e := &Error{File: l.file, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	l.errs = append(l.errs, e)
}

func (l *loader) at(n *yaml.Node) pos { return pos{l.file, n.Line, n.Column} }

func (l *loader) load(file string, data []byte) {
	l.file = file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	docs := 0
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			l.yamlError(data, err)
			return
		}
		if len(doc.Content) == 0 {
			continue
		}
		docs++
		l.document(deref(doc.Content[0]))
	}
	if docs == 0 {
		l.errs = append(l.errs, &Error{File: file, Msg: "empty configuration"})
	}
}

// yamlError turns the YAML library's "yaml: line 3: ..." into file:line
// form. The library names the line where the construct it was reading
// began (the mapping a misindented key breaks); the line that broke it is
// the first whose prefix of the file no longer parses, found by bisection.
func (l *loader) yamlError(data []byte, err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	e := &Error{File: l.file, Msg: msg}
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, tail, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				e.Line, e.Column, e.Msg = n, 1, tail
			}
		}
	}
	if !strings.Contains(e.Msg, "end of stream") {
		// The parser names no line for some errors (an unknown anchor,
		// invalid UTF-8, nesting too deep) and too early a line for
		// others: the first line whose prefix no longer parses is it.
		lines := yamlLines(data)
		lo, hi := max(e.Line, 1), len(lines) // the first lo lines may parse; all do not
		for lo < hi {
			mid := (lo + hi) / 2
			if parses(bytes.Join(lines[:mid], nil)) {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		if lo > e.Line && lo <= len(lines) {
			e.Line = lo
			e.Column = 1 + len(lines[lo-1]) - len(bytes.TrimLeft(lines[lo-1], " "))
		}
		if e.Line >= 1 && e.Line <= len(lines) {
			e.Msg += braceHint(string(lines[e.Line-1]))
		}
	}
	if e.Line == 0 {
		// The library leaves out the line only when it is the first.
		e.Line, e.Column = 1, 1
	}
	l.errs = append(l.errs, e)
}

// yamlLines splits data after each line break as YAML counts them: CR
// LF, CR, LF, NEL, LS and PS, so that a file written with CR line
// endings has its lines too.
func yamlLines(data []byte) [][]byte {
	var lines [][]byte
	start := 0
	for i := 0; i < len(data); {
		n := 0
		switch rest := data[i:]; {
		case bytes.HasPrefix(rest, []byte("\r\n")):
			n = 2
		case rest[0] == '\r', rest[0] == '\n':
			n = 1
		case bytes.HasPrefix(rest, []byte("\u0085")):
			n = 2
		case bytes.HasPrefix(rest, []byte("\u2028")), bytes.HasPrefix(rest, []byte("\u2029")):
			n = 3
		}
		if n == 0 {
			i++
			continue
		}
		i += n
		lines = append(lines, data[start:i])
		start = i
	}
	// The last line, or an empty one after a final break, as SplitAfter.
	return append(lines, data[start:])
}

// braceHint names the usual cause of a syntax error on a line whose value
// starts with an unquoted '{' (key: {user}:{id}): YAML reads a flow
// mapping there, which the rest of the value breaks.
func braceHint(line string) string {
	name, value, ok := strings.Cut(strings.TrimSpace(line), ": ")
	value = strings.TrimSpace(value)
	if !ok || !strings.HasPrefix(value, "{") {
		return ""
	}
	name = strings.TrimSpace(strings.TrimPrefix(name, "- "))
	return fmt.Sprintf(": a value that starts with '{' is a YAML mapping; quote it (%s: %q)", name, value)
}

// parses reports whether data is well-formed YAML.
func parses(data []byte) bool {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		switch err := dec.Decode(&n); {
		case errors.Is(err, io.EOF):
			return true
		case err != nil:
			return false
		}
	}
}

// deref follows aliases (*name) to the node they name. Errors about an
// aliased value name the anchor's position.
func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// document loads one YAML document: sluice's format or Envoy's.
func (l *loader) document(n *yaml.Node) {
	if n.Kind != yaml.MappingNode {
		l.errorf(n, "want a mapping with policies (sluice) or domain and descriptors (envoy ratelimit)")
		return
	}
	var domainNode, policies, descriptors, allowEmpty *yaml.Node
	l.fields(n, map[string]**yaml.Node{
		"domain": &domainNode, "policies": &policies, "descriptors": &descriptors, "allow_empty": &allowEmpty,
	})
	if allowEmpty != nil && l.boolean(allowEmpty, "allow_empty") {
		l.cfg.AllowEmpty = true
	}
	if policies == nil && descriptors == nil && domainNode == nil {
		l.errorf(n, "want policies (sluice format) or domain and descriptors (envoy ratelimit format)")
		return
	}
	domainName := ""
	if domainNode != nil {
		domainName = l.str(domainNode)
		if domainName == "" {
			l.errorf(domainNode, "domain must not be empty")
		} else if enforce.ValidateName(domainName) != nil {
			// Domains name policies (Envoy's "domain.key_value"): same rule.
			l.errorf(domainNode, "domain %q: %s", domainName, enforce.NameRule)
			return
		}
	} else if descriptors != nil {
		l.errorf(n, "envoy ratelimit config needs a domain")
		return
	} else {
		domainName = DefaultDomain
	}
	at := l.at(n)
	if domainNode != nil {
		at = l.at(domainNode)
	}
	if prev, dup := l.domPos[domainName]; dup {
		// Policies that name no domain all answer in the default one,
		// whichever file or document they are in.
		if domainNode == nil && l.implicitDefault {
			l.policies(l.cfg.domains[domainName], policies)
			return
		}
		hint := ""
		if domainNode == nil || domainName == DefaultDomain && l.implicitDefault {
			hint = fmt.Sprintf(": policies without a domain: line are in domain %q; write another domain in one of the two", DefaultDomain)
		}
		l.errorf(orNode(domainNode, n), "duplicate domain %q (first at %s)%s", domainName, prev, hint)
		return
	}
	if domainName == DefaultDomain {
		l.implicitDefault = domainNode == nil
	}
	l.domPos[domainName] = at
	d := &Domain{name: domainName, root: &descNode{children: map[entryKey]*descNode{}}}
	l.cfg.domains[domainName] = d
	if descriptors != nil {
		l.descriptors(d, d.root, domainName, descriptors)
	}
	if policies != nil {
		l.policies(d, policies)
	}
}

// fields checks that n is a mapping whose keys are all in want, with no
// duplicates, and stores each value node, aliases followed. Merge keys
// ("<<: *defaults", or a list of aliases) fill the fields n does not set
// itself, earlier merged mappings first.
func (l *loader) fields(n *yaml.Node, want map[string]**yaml.Node) bool {
	return l.fieldsOffering(n, want, nil)
}

// fieldsOffering is fields where the unknown-field message leaves out the
// names in unlisted: fields read only to refuse them with a better message.
func (l *loader) fieldsOffering(n *yaml.Node, want map[string]**yaml.Node, unlisted map[string]bool) bool {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		l.errorf(n, "want a mapping, got %s", kindName(n))
		return false
	}
	ok := true
	l.reading[n] = true
	defer delete(l.reading, n)
	var merged, mergedAt []*yaml.Node // mergedAt: where each is named
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], deref(n.Content[i+1])
		if k.Tag == "!!merge" {
			switch v.Kind {
			case yaml.MappingNode:
				merged, mergedAt = append(merged, v), append(mergedAt, n.Content[i+1])
			case yaml.SequenceNode:
				for _, m := range v.Content {
					merged, mergedAt = append(merged, deref(m)), append(mergedAt, m)
				}
			default:
				l.errorf(v, "a merge key wants a mapping or a list of them, got %s", kindName(v))
				ok = false
			}
			continue
		}
		dst, known := want[k.Value]
		if !known {
			names := make([]string, 0, len(want))
			for name := range want {
				if !unlisted[name] {
					names = append(names, name)
				}
			}
			sort.Strings(names)
			l.errorf(k, "unknown field %q (want one of %s)", k.Value, strings.Join(names, ", "))
			ok = false
			continue
		}
		if *dst != nil {
			l.errorf(k, "duplicate field %q", k.Value)
			ok = false
			continue
		}
		*dst = v
	}
	for i, m := range merged {
		if m.Kind != yaml.MappingNode {
			l.errorf(m, "a merge key wants a mapping, got %s", kindName(m))
			ok = false
			continue
		}
		if l.reading[m] {
			l.errorf(mergedAt[i], "a merge key names a mapping that holds it (*%s): it would merge itself forever", mergedAt[i].Value)
			ok = false
			continue
		}
		sub := make(map[string]**yaml.Node, len(want))
		for name := range want {
			sub[name] = new(*yaml.Node)
		}
		if !l.fieldsOffering(m, sub, unlisted) {
			ok = false
		}
		for name, dst := range want {
			if *dst == nil {
				*dst = *sub[name]
			}
		}
	}
	return ok
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "nothing"
}

func (l *loader) str(n *yaml.Node) string {
	n = deref(n)
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		l.errorf(n, "want a string, got %s", kindName(n))
		return ""
	}
	return n.Value
}

// boolean reads field name's value, which must be a YAML boolean: true
// or false, unquoted. Decoding alone would also turn YAML 1.1's yes, on,
// y (quoted too) into true, while refusing a quoted "true".
func (l *loader) boolean(n *yaml.Node, name string) bool {
	n = deref(n)
	var b bool
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&b) != nil {
		got := kindName(n)
		if n.Kind == yaml.ScalarNode && n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0 {
			got = "a quoted string " + got
		}
		l.errorf(n, "%s: want true or false, unquoted, got %s", name, got)
		return false
	}
	return b
}

// integer reads field name's value: the name is in the message, since a
// flow mapping ({max: 0, hold: 1s}) puts several fields on one line.
func (l *loader) integer(n *yaml.Node, name string, min, max int64) int64 {
	n = deref(n)
	var v int64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil {
		l.errorf(n, "%s: want an integer, got %s", name, kindName(n))
		return min
	}
	if v < min || v > max {
		l.errorf(n, "%s %d is out of range [%d, %d]", name, v, min, max)
		return min
	}
	return v
}

func (l *loader) seq(n *yaml.Node) []*yaml.Node {
	n = deref(n)
	if n.Kind != yaml.SequenceNode {
		if n.Tag == "!!null" {
			return nil
		}
		l.errorf(n, "want a list, got %s", kindName(n))
		return nil
	}
	out := make([]*yaml.Node, len(n.Content))
	for i, c := range n.Content {
		out[i] = deref(c)
	}
	return out
}

func orNode(a, b *yaml.Node) *yaml.Node {
	if a != nil {
		return a
	}
	return b
}

// OverrideName is the policy name under which domain's limits carried in
// Envoy requests are counted; no configured policy may take it.
func OverrideName(domain string) string { return domain + ".override" }

// addPolicy validates p's engine rules and registers it under its name.
func (l *loader) addPolicy(p *Policy, n *yaml.Node) bool {
	if p.Name == OverrideName(p.Domain) {
		l.errorf(n, "policy name %q is reserved: the limits Envoy requests carry (descriptor limit overrides) are counted under it; choose another name", p.Name)
		return false
	}
	if err := p.setRules(); err != nil {
		l.errorf(n, "policy %q: %v", p.Name, err)
		return false
	}
	if prev, dup := l.cfg.byName[p.Name]; dup {
		l.errorf(n, "duplicate policy name %q (first at %s)", p.Name, prev.pos)
		return false
	}
	l.cfg.byName[p.Name] = p
	l.cfg.Policies = append(l.cfg.Policies, p)
	return true
}

func (l *loader) finish() (*Config, error) {
	if len(l.errs) > 0 {
		return nil, errors.Join(l.errs...)
	}
	return l.cfg, nil
}
