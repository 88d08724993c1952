package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice"
)

// ErrConfig is wrapped by every configuration error. A *ConfigError carries
// the file and line.
var ErrConfig = errors.New("server: invalid config")

// ConfigError is one problem in a configuration file, with its position.
type ConfigError struct {
	File   string
	Line   int
	Column int
	Msg    string
}

func (e *ConfigError) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("%s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Column, e.Msg)
}

// Unwrap makes errors.Is(err, ErrConfig) true.
func (e *ConfigError) Unwrap() error { return ErrConfig }

// Strategy is what a policy does with a request over its limit.
type Strategy uint8

const (
	// Reject denies the request: HTTP 429, Envoy OVER_LIMIT.
	Reject Strategy = iota
	// Shadow records the denial (metrics, stats) but lets the request
	// through: a dry run before enforcing a new limit.
	Shadow
)

func (s Strategy) String() string {
	if s == Shadow {
		return "shadow"
	}
	return "reject"
}

// DefaultDomain is the Envoy domain of sluice-format files that name none.
const DefaultDomain = "sluice"

// Policy is one named limit. Sluice-format policies come from a file's
// policies list; Envoy-format rate_limit blocks become policies named by
// their descriptor path, as envoyproxy/ratelimit names their stats
// ("domain.key_value.key").
type Policy struct {
	Name     string
	Limit    sluice.Limit
	Cost     int64 // units a request takes when it names no cost; at least 1
	Strategy Strategy

	// Key is the key template (sluice format): "{user}:{route}". Envoy
	// descriptors whose entry keys are exactly its variables render it.
	Key       string
	Overrides []Override

	// Domain is the Envoy domain the policy answers in.
	Domain string

	// ExposeKeys lets the top-keys metrics carry this policy's keys as
	// they are; by default they carry a hash prefix (keys are API keys,
	// user ids, IPs).
	ExposeKeys bool

	envoy bool // from an Envoy-format rate_limit

	tmpl     *template
	explicit bool // Key was written in the file, so descriptors may match it
	pos      pos
}

// Override replaces a policy's limit for the keys it matches: premium
// tiers, allow-listed partners, a stricter limit for a known abuser.
type Override struct {
	// Match lists keys: exact, or a prefix ending in "*" ("premium:*").
	Match []string
	Limit sluice.Limit
}

// limitFor returns the limit that applies to key: the first matching
// override's, else the policy's.
func (p *Policy) limitFor(key string) sluice.Limit {
	for i := range p.Overrides {
		for _, m := range p.Overrides[i].Match {
			if globMatch(m, key) {
				return p.Overrides[i].Limit
			}
		}
	}
	return p.Limit
}

func globMatch(pattern, s string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(s, prefix)
	}
	return pattern == s
}

// Config is a loaded, validated configuration. It is immutable once
// loaded: a reload builds a new one and swaps it in whole.
type Config struct {
	// Policies in file order; the JSON API and the dashboard list them.
	Policies []*Policy
	// Files the configuration was read from; empty for the demo.
	Files []string
	// AllowEmpty: a file says allow_empty: true, so having no policies is
	// meant (the service then limits nothing) rather than a mistake.
	AllowEmpty bool

	byName  map[string]*Policy
	domains map[string]*domain
}

// Policy returns the policy called name, or nil.
func (c *Config) Policy(name string) *Policy { return c.byName[name] }

// Domains returns the Envoy domains the configuration answers, sorted.
func (c *Config) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// LoadConfig reads a configuration file, or every *.yaml and *.yml file in
// a directory (as envoyproxy/ratelimit loads its runtime directory). Each
// YAML document in a file is either sluice's own format (a policies list)
// or envoyproxy/ratelimit's (domain and descriptors). Errors wrap ErrConfig
// and name file:line.
func LoadConfig(path string) (*Config, error) {
	files, err := configFiles(path)
	if err != nil {
		return nil, err
	}
	l := newLoader()
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		l.load(f, data)
	}
	cfg, err := l.finish()
	if err != nil {
		return nil, err
	}
	cfg.Files = files
	return cfg, nil
}

// ParseConfig parses configuration text; name is used in error messages.
func ParseConfig(name string, data []byte) (*Config, error) {
	l := newLoader()
	l.load(name, data)
	return l.finish()
}

func configFiles(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if !st.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	var files []string
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if !e.IsDir() && (ext == ".yaml" || ext == ".yml") && !strings.HasPrefix(e.Name(), ".") {
			files = append(files, filepath.Join(path, e.Name()))
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: %s: no .yaml or .yml files", ErrConfig, path)
	}
	return files, nil
}

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
}

func newLoader() *loader {
	return &loader{
		cfg:    &Config{byName: map[string]*Policy{}, domains: map[string]*domain{}},
		domPos: map[string]pos{},
	}
}

func (l *loader) errorf(n *yaml.Node, format string, args ...any) {
	if len(l.errs) >= maxConfigErrors {
		return
	}
	e := &ConfigError{File: l.file, Msg: fmt.Sprintf(format, args...)}
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
			l.yamlError(err)
			return
		}
		if len(doc.Content) == 0 {
			continue
		}
		docs++
		l.document(doc.Content[0])
	}
	if docs == 0 {
		l.errs = append(l.errs, &ConfigError{File: file, Msg: "empty configuration"})
	}
}

// yamlError turns yaml.v3's "yaml: line 3: ..." into file:line form.
func (l *loader) yamlError(err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	e := &ConfigError{File: l.file, Msg: msg}
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, tail, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				e.Line, e.Column, e.Msg = n, 1, tail
			}
		}
	}
	l.errs = append(l.errs, e)
}

func (l *loader) document(n *yaml.Node) {
	if n.Kind != yaml.MappingNode {
		l.errorf(n, "want a mapping with policies (sluice) or domain and descriptors (envoy ratelimit)")
		return
	}
	var domainNode, policies, descriptors, allowEmpty *yaml.Node
	l.fields(n, map[string]**yaml.Node{
		"domain": &domainNode, "policies": &policies, "descriptors": &descriptors, "allow_empty": &allowEmpty,
	})
	if allowEmpty != nil && l.boolean(allowEmpty) {
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
		l.errorf(orNode(domainNode, n), "duplicate domain %q (first at %s)", domainName, prev)
		return
	}
	l.domPos[domainName] = at
	d := &domain{name: domainName, root: &descNode{children: map[entryKey]*descNode{}}}
	l.cfg.domains[domainName] = d
	if descriptors != nil {
		l.descriptors(d, d.root, domainName, descriptors)
	}
	if policies != nil {
		l.policies(d, policies)
	}
}

// fields checks that n is a mapping whose keys are all in want, with no
// duplicates, and stores each value node.
func (l *loader) fields(n *yaml.Node, want map[string]**yaml.Node) bool {
	if n.Kind != yaml.MappingNode {
		l.errorf(n, "want a mapping, got %s", kindName(n))
		return false
	}
	ok := true
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		dst, known := want[k.Value]
		if !known {
			names := make([]string, 0, len(want))
			for name := range want {
				names = append(names, name)
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
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		l.errorf(n, "want a string, got %s", kindName(n))
		return ""
	}
	return n.Value
}

func (l *loader) boolean(n *yaml.Node) bool {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		l.errorf(n, "want true or false, got %s", kindName(n))
	}
	return b
}

func (l *loader) integer(n *yaml.Node, min, max int64) int64 {
	var v int64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil {
		l.errorf(n, "want an integer, got %s", kindName(n))
		return min
	}
	if v < min || v > max {
		l.errorf(n, "%d is out of range [%d, %d]", v, min, max)
		return min
	}
	return v
}

func (l *loader) seq(n *yaml.Node) []*yaml.Node {
	if n.Kind != yaml.SequenceNode {
		if n.Tag == "!!null" {
			return nil
		}
		l.errorf(n, "want a list, got %s", kindName(n))
		return nil
	}
	return n.Content
}

func (l *loader) addPolicy(p *Policy, n *yaml.Node) bool {
	if prev, dup := l.cfg.byName[p.Name]; dup {
		l.errorf(n, "duplicate policy name %q (first at %s)", p.Name, prev.pos)
		return false
	}
	l.cfg.byName[p.Name] = p
	l.cfg.Policies = append(l.cfg.Policies, p)
	return true
}

// policies loads sluice's own format.
func (l *loader) policies(d *domain, list *yaml.Node) {
	for _, n := range l.seq(list) {
		var name, alg, limit, burst, key, cost, strategy, overrides, expose *yaml.Node
		if !l.fields(n, map[string]**yaml.Node{
			"name": &name, "algorithm": &alg, "limit": &limit, "burst": &burst,
			"key": &key, "cost": &cost, "strategy": &strategy, "overrides": &overrides,
			"expose_keys": &expose,
		}) {
			continue
		}
		p := &Policy{Cost: 1, Domain: d.name, Key: "{key}", pos: l.at(n)}
		p.ExposeKeys = expose != nil && l.boolean(expose)
		if name == nil {
			l.errorf(n, "policy needs a name")
			continue
		}
		if p.Name = l.str(name); !validName(p.Name) {
			l.errorf(name, "policy name %q: use letters, digits, '.', '_' and '-'", p.Name)
			continue
		}
		if limit == nil {
			l.errorf(n, "policy %q needs a limit such as \"100/min\"", p.Name)
			continue
		}
		lim, ok := l.limit(limit, alg, burst, sluice.GCRA)
		if !ok {
			continue
		}
		p.Limit = lim
		if cost != nil {
			p.Cost = l.integer(cost, 1, sluice.MaxRate)
			if err := p.Limit.ValidateCost(p.Cost); err != nil {
				l.errorf(cost, "%v", err)
			}
		}
		if strategy != nil {
			switch s := l.str(strategy); s {
			case "reject":
			case "shadow":
				p.Strategy = Shadow
			default:
				l.errorf(strategy, "strategy %q: want reject or shadow", s)
			}
		}
		if key != nil {
			p.Key = l.str(key)
			p.explicit = true
		}
		t, err := parseTemplate(p.Key)
		if err != nil {
			l.errorf(orNode(key, n), "key %q: %v", p.Key, err)
			continue
		}
		p.tmpl = t
		if overrides != nil {
			p.Overrides = l.overrides(p, overrides)
		}
		if !l.addPolicy(p, name) {
			continue
		}
		d.policies = append(d.policies, p)
		if p.explicit {
			sig := t.signature()
			if prev, dup := d.bySig[sig]; dup {
				l.errorf(key, "key %q takes the same descriptor entries as policy %q (%s): a descriptor could not tell them apart", p.Key, prev.Name, prev.pos)
				continue
			}
			if d.bySig == nil {
				d.bySig = map[string]*Policy{}
			}
			d.bySig[sig] = p
		}
	}
}

func orNode(a, b *yaml.Node) *yaml.Node {
	if a != nil {
		return a
	}
	return b
}

// limit parses a limit string. The algorithm is the one the string names,
// else the algorithm field, else def; a burst field sets the burst.
func (l *loader) limit(limit, alg, burst *yaml.Node, def sluice.Algorithm) (sluice.Limit, bool) {
	s := l.str(limit)
	a := def
	if alg != nil {
		v, err := sluice.ParseAlgorithm(l.str(alg))
		if err != nil {
			l.errorf(alg, "%v", err)
			return sluice.Limit{}, false
		}
		a = v
	}
	named, hasAlg := leadingAlgorithm(s)
	if hasAlg && alg != nil && named != a {
		l.errorf(alg, "algorithm %s contradicts the limit's %s", a, named)
		return sluice.Limit{}, false
	}
	lim, err := sluice.ParseLimit(s)
	if !hasAlg {
		// Validate under the right algorithm: "2000000/s" is too fast for
		// GCRA but fine for a fixed window.
		if l2, err2 := sluice.ParseLimit(a.String() + " " + s); err2 == nil || err == nil {
			lim, err = l2, err2
		}
	}
	if err != nil {
		l.errorf(limit, "%v", err)
		return lim, false
	}
	if burst != nil {
		lim.Burst = l.integer(burst, 1, sluice.MaxRate)
		if err := lim.Validate(); err != nil {
			l.errorf(burst, "%v", err)
			return lim, false
		}
	}
	return lim, true
}

func leadingAlgorithm(s string) (sluice.Algorithm, bool) {
	f := strings.Fields(s)
	if len(f) == 0 || f[0][0] < 'A' {
		return 0, false
	}
	a, err := sluice.ParseAlgorithm(f[0])
	return a, err == nil
}

func (l *loader) overrides(p *Policy, list *yaml.Node) []Override {
	var out []Override
	for _, n := range l.seq(list) {
		var match, limit, alg, burst *yaml.Node
		if !l.fields(n, map[string]**yaml.Node{"match": &match, "limit": &limit, "algorithm": &alg, "burst": &burst}) {
			continue
		}
		if match == nil || limit == nil {
			l.errorf(n, "override needs match and limit")
			continue
		}
		var o Override
		if match.Kind == yaml.SequenceNode {
			for _, m := range match.Content {
				o.Match = append(o.Match, l.str(m))
			}
		} else {
			o.Match = []string{l.str(match)}
		}
		if len(o.Match) == 0 {
			l.errorf(match, "override matches no key")
			continue
		}
		lim, ok := l.limit(limit, alg, burst, p.Limit.Algorithm)
		if !ok {
			continue
		}
		if err := lim.ValidateCost(p.Cost); err != nil {
			l.errorf(limit, "override: %v", err)
			continue
		}
		o.Limit = lim
		out = append(out, o)
	}
	return out
}

func validName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Envoy units, as envoyproxy/ratelimit converts them to seconds.
var envoyUnits = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// descriptors loads envoyproxy/ratelimit's format into the tree under parent.
func (l *loader) descriptors(d *domain, parent *descNode, path string, list *yaml.Node) {
	for _, n := range l.seq(list) {
		var key, value, rateLimit, children, shadow, quota, detailed, valueToMetric, share *yaml.Node
		if !l.fields(n, map[string]**yaml.Node{
			"key": &key, "value": &value, "rate_limit": &rateLimit, "descriptors": &children,
			"shadow_mode": &shadow, "quota_mode": &quota, "detailed_metric": &detailed,
			"value_to_metric": &valueToMetric, "share_threshold": &share,
		}) {
			continue
		}
		if key == nil || key.Value == "" {
			l.errorf(n, "descriptor has empty key")
			continue
		}
		dn := &descNode{children: map[entryKey]*descNode{}, pos: l.at(n)}
		ek := entryKey{key: l.str(key)}
		if value != nil {
			ek.value = l.str(value)
		}
		finalKey := ek.key
		if ek.value != "" {
			finalKey += "_" + ek.value
		}
		name := path + "." + finalKey
		if detailed != nil {
			l.boolean(detailed) // metrics detail: accepted, the Prometheus labels are per policy
		}
		if valueToMetric != nil {
			l.boolean(valueToMetric)
		}
		wildcard := strings.HasSuffix(ek.value, "*")
		if share != nil && l.boolean(share) {
			if !wildcard {
				l.errorf(share, "share_threshold can only be used with wildcard values (ending with '*'), but found key '%s'", finalKey)
			}
			dn.shareThreshold = true
		}
		shadowMode := shadow != nil && l.boolean(shadow)
		quotaMode := quota != nil && l.boolean(quota)
		if rateLimit != nil {
			l.rateLimit(d, dn, name, rateLimit, shadowMode, quotaMode)
		}
		if _, dup := parent.children[ek]; dup {
			l.errorf(n, "duplicate descriptor composite key '%s'", name)
			continue
		}
		parent.children[ek] = dn
		if wildcard {
			parent.wildcards = append(parent.wildcards, ek)
		}
		if children != nil {
			l.descriptors(d, dn, name, children)
		}
	}
}

func (l *loader) rateLimit(d *domain, dn *descNode, name string, n *yaml.Node, shadow, quota bool) {
	var unit, rpu, unlimited, rname, replaces, alg *yaml.Node
	if !l.fields(n, map[string]**yaml.Node{
		"unit": &unit, "requests_per_unit": &rpu, "unlimited": &unlimited,
		"name": &rname, "replaces": &replaces, "algorithm": &alg,
	}) {
		return
	}
	r := &rule{shadow: shadow || quota}
	if rname != nil {
		r.name = l.str(rname)
	}
	for _, rep := range l.seq(orNode(replaces, &yaml.Node{Kind: yaml.SequenceNode})) {
		var rn *yaml.Node
		if !l.fields(rep, map[string]**yaml.Node{"name": &rn}) {
			continue
		}
		if rn == nil || rn.Value == "" {
			l.errorf(rep, "should not have an empty replaces entry")
			continue
		}
		if rn.Value == r.name {
			l.errorf(rn, "replaces should not contain name of same descriptor")
			continue
		}
		r.replaces = append(r.replaces, rn.Value)
	}
	var period time.Duration
	if unit != nil {
		period = envoyUnits[strings.ToLower(l.str(unit))]
	}
	if unlimited != nil && l.boolean(unlimited) {
		if period != 0 {
			l.errorf(unit, "should not specify rate limit unit when unlimited")
		}
		r.unlimited = true
		dn.rule = r
		return
	}
	if period == 0 {
		v := ""
		if unit != nil {
			v = unit.Value
		}
		l.errorf(orNode(unit, n), "invalid rate limit unit '%s'", v)
		return
	}
	var perUnit int64
	if rpu != nil {
		perUnit = l.integer(rpu, 0, 1<<32-1)
	}
	if perUnit == 0 { // envoyproxy/ratelimit's "block everything" (Example 3)
		r.blocked = true
		r.period = period
		dn.rule = r
		return
	}
	lim := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: perUnit, Period: period}
	if alg != nil {
		a, err := sluice.ParseAlgorithm(l.str(alg))
		if err != nil {
			l.errorf(alg, "%v", err)
			return
		}
		lim.Algorithm = a
	}
	if err := lim.Validate(); err != nil {
		l.errorf(orNode(rpu, n), "%v", err)
		return
	}
	r.period = period
	p := &Policy{Name: name, Limit: lim, Cost: 1, Domain: d.name, envoy: true, pos: l.at(n)}
	if shadow || quota { // neither ever refuses a request
		p.Strategy = Shadow
	}
	if !l.addPolicy(p, n) {
		return
	}
	r.policy = p
	dn.rule = r
}

func (l *loader) finish() (*Config, error) {
	if len(l.errs) > 0 {
		return nil, errors.Join(l.errs...)
	}
	return l.cfg, nil
}

// Describe prints what the configuration holds, for check-config.
func (c *Config) Describe(w io.Writer) {
	fmt.Fprintf(w, "%d policies in %d domains\n", len(c.Policies), len(c.domains))
	for _, name := range c.Domains() {
		d := c.domains[name]
		fmt.Fprintf(w, "domain %s\n", name)
		d.root.describe(w, "  ")
		for _, p := range d.policies {
			fmt.Fprintf(w, "  policy %s: %s", p.Name, p.Limit)
			if p.Cost != 1 {
				fmt.Fprintf(w, ", cost %d", p.Cost)
			}
			if p.Strategy == Shadow {
				fmt.Fprint(w, ", shadow")
			}
			if p.explicit {
				fmt.Fprintf(w, ", key %s", p.Key)
			}
			fmt.Fprintln(w)
			for _, o := range p.Overrides {
				fmt.Fprintf(w, "    override %s: %s\n", strings.Join(o.Match, ", "), o.Limit)
			}
		}
	}
}
