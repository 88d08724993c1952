// Package config is the service's configuration: the model (policies,
// Envoy domains and their descriptor trees), the strict YAML reader,
// sluice's own format (sluice.go), envoyproxy/ratelimit's format
// (envoy.go), descriptor matching and key templates (match.go), and
// Describe for check-config. It reads files and nothing else: no store,
// transport or metrics, so that `sluice check-config` needs only it.
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/internal/ipkey"
)

// ErrConfig is wrapped by every configuration error. An *Error carries the
// file and line.
var ErrConfig = errors.New("config: invalid config")

// Error is one problem in a configuration file, with its position.
type Error struct {
	File   string
	Line   int
	Column int
	Msg    string
}

func (e *Error) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("%s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Column, e.Msg)
}

// Unwrap makes errors.Is(err, ErrConfig) true.
func (e *Error) Unwrap() error { return ErrConfig }

// DefaultDomain is the Envoy domain of sluice-format files that name none.
const DefaultDomain = "sluice"

// Policy is one named limit. Sluice-format policies come from a file's
// policies list; Envoy-format rate_limit blocks become policies named by
// their descriptor path, as envoyproxy/ratelimit names their stats
// ("domain.key_value.key").
type Policy struct {
	Name  string
	Limit sluice.Limit
	// Cost is the units a request takes when it names no cost; at least 1.
	Cost int64
	// Strategy is enforce.Reject (the default), enforce.Shadow (a dry run:
	// shadow_mode and quota_mode in Envoy's format) or enforce.Penalty.
	Strategy enforce.Strategy
	// Penalty is how long a Penalty policy blocks a key after a violation.
	Penalty time.Duration

	// Key is the key template (sluice format): "{user}:{route}". Envoy
	// descriptors whose entry keys are exactly its variables render it.
	Key       string
	Overrides []Override

	// Domain is the Envoy domain the policy answers in.
	Domain string

	// InFlight, when set, makes this an in-flight policy (inflight.go):
	// Limit, Cost, Strategy, Penalty and Overrides are then unset, and
	// only the JSON API's acquire, extend and release use it.
	InFlight *InFlight

	// IPv6Prefix, when set (1 to 128), groups the values of the key
	// template's variables that are IP addresses, as Envoy descriptors
	// fill them: an IPv6 address is keyed by its /IPv6Prefix
	// ("2001:db8:1:2::/64"), an IPv4-mapped one as the IPv4 address, so
	// that one host cannot rotate through its /64 for fresh budgets.
	// Sluice format `ipv6_prefix: 64`. Default 0: values as sent, as
	// envoyproxy/ratelimit keys them.
	IPv6Prefix int
	ipGroup    *ipkey.Resolver

	// ExposeKeys lets the top-keys metrics carry this policy's keys as
	// they are (clipped past 128 bytes); by default they carry a keyed
	// hash (keys are API keys, user ids, IPs).
	ExposeKeys bool

	// Lease is the maximum staleness (D) of the policy's leases (package
	// lease): decisions are answered in memory from units taken ahead
	// from the store, and the fleet may admit up to r × D beyond the
	// limit (r its rate). Sluice format `lease: 50ms`; at most the period
	// of the policy's limit and of every override. Default 0: no lease,
	// every decision asks the store.
	Lease time.Duration

	envoy bool // from an Envoy-format rate_limit

	rules    []enforce.Rule // the policy's rule, then one per override
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

// Envoy reports whether the policy comes from an Envoy-format rate_limit
// block (or a limit an Envoy request carried).
func (p *Policy) Envoy() bool { return p.envoy }

// Rule returns the engine rule that applies to key: the first matching
// override's limit, else the policy's. Every rule is named after the
// policy. A Policy not made by Load, Parse or NewEnvoyPolicy (or an
// in-flight policy, which has none) gets a rule made from its fields,
// unvalidated.
func (p *Policy) Rule(key string) *enforce.Rule {
	i := p.override(key)
	if len(p.rules) != 1+len(p.Overrides) {
		return &enforce.Rule{Name: p.Name, Limit: p.LimitFor(key), Strategy: p.Strategy, Penalty: p.Penalty}
	}
	return &p.rules[i+1]
}

// Rules returns the engine rules Rule picks from: the policy's, then one
// per override (none for an in-flight policy or one not made by Load,
// Parse or NewEnvoyPolicy). They are the config's: do not modify them.
func (p *Policy) Rules() []enforce.Rule { return p.rules }

// LimitFor returns the limit that applies to key: the first matching
// override's, else the policy's.
func (p *Policy) LimitFor(key string) sluice.Limit {
	if i := p.override(key); i >= 0 {
		return p.Overrides[i].Limit
	}
	return p.Limit
}

// override returns the index of the first override matching key, or -1.
func (p *Policy) override(key string) int {
	for i := range p.Overrides {
		for _, m := range p.Overrides[i].Match {
			if globMatch(m, key) {
				return i
			}
		}
	}
	return -1
}

// NewEnvoyPolicy returns a policy for a limit that an Envoy request
// carries itself (a descriptor's limit override).
func NewEnvoyPolicy(name, domain string, lim sluice.Limit) (*Policy, error) {
	p := &Policy{Name: name, Limit: lim, Cost: 1, Domain: domain, envoy: true}
	if err := p.setRules(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return p, nil
}

// setRules builds the policy's engine rules and validates them.
func (p *Policy) setRules() error {
	if p.InFlight != nil { // no engine rule: the service acquires slots
		return nil
	}
	p.rules = make([]enforce.Rule, 0, 1+len(p.Overrides))
	base := enforce.Rule{Name: p.Name, Limit: p.Limit, Strategy: p.Strategy, Penalty: p.Penalty}
	p.rules = append(p.rules, base)
	for _, o := range p.Overrides {
		r := base
		r.Limit = o.Limit
		p.rules = append(p.rules, r)
	}
	for i := range p.rules {
		if err := p.rules[i].Validate(); err != nil {
			return err
		}
	}
	return nil
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
	// Files the configuration was read from; empty for text parsed with
	// Parse.
	Files []string
	// AllowEmpty: a file says allow_empty: true, so having no policies is
	// meant (the service then limits nothing) rather than a mistake.
	AllowEmpty bool

	byName  map[string]*Policy
	domains map[string]*Domain
}

// Policy returns the policy called name, or nil.
func (c *Config) Policy(name string) *Policy { return c.byName[name] }

// Blocks returns how many Envoy-format rules block every request
// (requests_per_unit: 0); they are rules without a policy.
func (c *Config) Blocks() int {
	n := 0
	for _, d := range c.domains {
		n += d.root.blocks()
	}
	return n
}

// Stateless returns the names of the Envoy-format rules that have no
// policy, blocks (requests_per_unit: 0) and unlimited ones: their
// descriptor paths, as a policy's name would be, sorted.
func (c *Config) Stateless() []string {
	var out []string
	for _, d := range c.Domains() {
		c.domains[d].root.stateless(&out)
	}
	sort.Strings(out)
	return out
}

func (n *descNode) stateless(out *[]string) {
	if n.rule != nil && (n.rule.Blocked || n.rule.Unlimited) {
		*out = append(*out, n.rule.Path)
	}
	for _, c := range n.children {
		c.stateless(out)
	}
}

func (n *descNode) blocks() int {
	b := 0
	if n.rule != nil && n.rule.Blocked {
		b++
	}
	for _, c := range n.children {
		b += c.blocks()
	}
	return b
}

// Domain returns the Envoy domain called name, or nil.
func (c *Config) Domain(name string) *Domain { return c.domains[name] }

// Domains returns the Envoy domains the configuration answers, sorted.
func (c *Config) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Load reads a configuration file, or every *.yaml and *.yml file in a
// directory (as envoyproxy/ratelimit loads its runtime directory). Each
// YAML document in a file is either sluice's own format (a policies list)
// or envoyproxy/ratelimit's (domain and descriptors). Errors wrap ErrConfig
// and name file:line:column.
func Load(path string) (*Config, error) {
	files, err := Files(path)
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

// Parse parses configuration text; name is used in error messages.
func Parse(name string, data []byte) (*Config, error) {
	l := newLoader()
	l.load(name, data)
	return l.finish()
}

// Files lists the files Load reads for path: path itself, or a
// directory's *.yaml and *.yml files (not hidden ones), sorted.
func Files(path string) ([]string, error) {
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
