package config

import (
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
)

// policies loads sluice's own format: a list of named policies.
func (l *loader) policies(d *Domain, list *yaml.Node) {
	for _, n := range l.seq(list) {
		var name, alg, limit, burst, key, cost, strategy, penalty, overrides, expose, lease, inFlight, ipv6 *yaml.Node
		if !l.fields(n, map[string]**yaml.Node{
			"name": &name, "algorithm": &alg, "limit": &limit, "burst": &burst, "key": &key,
			"cost": &cost, "strategy": &strategy, "penalty": &penalty, "overrides": &overrides,
			"expose_keys": &expose, "lease": &lease, "in_flight": &inFlight, "ipv6_prefix": &ipv6,
		}) {
			continue
		}
		p := &Policy{Cost: 1, Domain: d.name, Key: "{key}", pos: l.at(n)}
		p.ExposeKeys = expose != nil && l.boolean(expose, "expose_keys")
		if name == nil {
			l.errorf(n, "policy needs a name")
			continue
		}
		if p.Name = l.str(name); enforce.ValidateName(p.Name) != nil {
			l.errorf(name, "policy name %q: %s", p.Name, enforce.NameRule)
			continue
		}
		if inFlight != nil {
			rate := map[string]*yaml.Node{"limit": limit, "algorithm": alg, "burst": burst, "cost": cost, "strategy": strategy, "penalty": penalty, "overrides": overrides, "lease": lease, "ipv6_prefix": ipv6}
			if l.inFlight(p, inFlight, rate) && l.keyTemplate(p, key, n) && l.addPolicy(p, name) {
				d.policies = append(d.policies, p)
			}
			continue
		}
		if limit == nil {
			l.errorf(n, "policy %q needs a limit such as \"100/min\" (or in_flight with max and hold, for an in-flight policy)", p.Name)
			continue
		}
		lim, ok := l.limit(limit, alg, burst, sluice.GCRA)
		if !ok {
			continue
		}
		p.Limit = lim
		if cost != nil {
			p.Cost = l.integer(cost, "cost", 1, sluice.MaxRate)
			if err := p.Limit.ValidateCost(p.Cost); err != nil {
				l.errorf(cost, "%v", err)
			}
		}
		if !l.strategy(p, strategy, penalty, n) {
			continue
		}
		if !l.keyTemplate(p, key, n) {
			continue
		}
		if ipv6 != nil {
			p.IPv6Prefix, p.ipGroup = l.ipv6Prefix(ipv6)
		}
		if overrides != nil {
			p.Overrides = l.overrides(p, overrides)
		}
		if lease != nil && !l.lease(p, lease) {
			continue
		}
		if !l.addPolicy(p, name) {
			continue
		}
		d.policies = append(d.policies, p)
		if p.explicit {
			sig := p.tmpl.signature()
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

// keyTemplate reads a policy's key template (n is the policy, for a
// missing key's errors).
func (l *loader) keyTemplate(p *Policy, key, n *yaml.Node) bool {
	if key != nil {
		k := deref(key)
		if k.Kind == yaml.MappingNode {
			// Unquoted, YAML reads {user} as a mapping, not as text.
			l.errorf(k, "key is a YAML mapping, not a template: quote the braces (key: %q)", braced(k))
			return false
		}
		if k.Kind != yaml.ScalarNode || k.Tag == "!!null" {
			l.str(key) // reports it, once
			return false
		}
		p.Key = k.Value
		p.explicit = true
	}
	t, err := parseTemplate(p.Key)
	if err != nil {
		l.errorf(orNode(key, n), "key %q: %v", p.Key, err)
		return false
	}
	for _, v := range t.vars {
		// A descriptor whose first entry is "policy" names a policy; one
		// with the entries such a template needs would be routed by it.
		if v == routingEntry {
			l.errorf(orNode(key, n), "key %q: variable {%s} is reserved: a descriptor whose first entry is %s=NAME goes to the policy NAME, so whether a descriptor reaches this template would hang on its entries' order and values; name the variable otherwise (such as {%s_name})", p.Key, v, v, v)
			return false
		}
	}
	p.tmpl = t
	return true
}

// braced is the text that an unquoted template such as {user} was likely
// written as, read back from the YAML mapping it became.
func braced(m *yaml.Node) string {
	var names []string
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Kind != yaml.ScalarNode || v.Kind != yaml.ScalarNode || v.Tag != "!!null" || v.Value != "" {
			return "{user}"
		}
		names = append(names, "{"+k.Value+"}")
	}
	if len(names) != 1 {
		return "{user}"
	}
	return names[0]
}

// strategy reads a policy's strategy and penalty fields. A service answers
// at once, so Delay, which holds requests, is not offered.
func (l *loader) strategy(p *Policy, strategy, penalty, n *yaml.Node) bool {
	if strategy != nil {
		s, err := enforce.ParseStrategy(l.str(strategy))
		if err != nil || s == enforce.Delay {
			l.errorf(strategy, "strategy %q: want reject or shadow, or penalty with a penalty duration", strategy.Value)
			return false
		}
		p.Strategy = s
	}
	switch {
	case p.Strategy == enforce.Penalty && penalty == nil:
		l.errorf(n, "policy %q: strategy penalty needs a penalty duration such as 10m", p.Name)
		return false
	case p.Strategy != enforce.Penalty && penalty != nil:
		l.errorf(penalty, "penalty applies only to strategy penalty")
		return false
	case penalty != nil:
		d, err := time.ParseDuration(l.str(penalty))
		if err != nil || d < sluice.MinPeriod || d > sluice.MaxPeriod {
			l.errorf(penalty, "penalty %q: want a duration between %v and %v", penalty.Value, sluice.MinPeriod, sluice.MaxPeriod)
			return false
		}
		p.Penalty = d
	}
	return true
}

// MinLease is the shortest lease a policy may have: a lease lives from when
// its grant is sent, so one shorter than a round trip to Redis expires
// before it can be used, and its units are lost to the fleet.
const MinLease = time.Millisecond

// lease reads a policy's lease field, its maximum staleness, and checks
// that the policy's limit and every override's can honour it: a positive
// duration no longer than any of their periods, under an algorithm that
// can grant (not the sliding window log, whose units are dated when
// taken).
func (l *loader) lease(p *Policy, n *yaml.Node) bool {
	d, err := time.ParseDuration(l.str(n))
	if err != nil || d <= 0 {
		l.errorf(n, "lease %q: want a positive duration such as 50ms, the leases' maximum staleness", n.Value)
		return false
	}
	if d < MinLease {
		l.errorf(n, "lease %v: shorter than %v, less than a round trip to Redis: every lease would expire before its first use; write %v or more, or drop the lease", d, MinLease, MinLease)
		return false
	}
	limits := []sluice.Limit{p.Limit}
	for _, o := range p.Overrides {
		limits = append(limits, o.Limit)
	}
	for i, lim := range limits {
		what := "the policy's limit"
		if i > 0 {
			what = fmt.Sprintf("override %s", strings.Join(p.Overrides[i-1].Match, ", "))
		}
		switch {
		case lim.Algorithm == sluice.SlidingWindowLog:
			l.errorf(n, "lease: %s (%v) cannot be leased: the sliding window log dates each unit when it is taken; use sliding_window_counter or drop the lease", what, lim)
			return false
		case d > lim.Period:
			l.errorf(n, "lease %v is longer than the period of %s (%v): a lease lives at most one period", d, what, lim)
			return false
		}
	}
	p.Lease = d
	return true
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
		l.errorf(alg, "algorithm %s contradicts the limit's %s: name the algorithm once, in the limit or in algorithm", a, named)
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
		b := l.integer(burst, "burst", 1, sluice.MaxRate)
		// As for the algorithm: the same burst twice is fine, two are not.
		if lim.Burst != 0 && lim.Burst != b {
			l.errorf(burst, "burst %d contradicts the limit's burst %d: give the burst once, in the limit or in burst", b, lim.Burst)
			return lim, false
		}
		lim.Burst = b
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
	type seen struct {
		match string
		at    pos
	}
	var earlier []seen // the matches of earlier overrides
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
		nodes := []*yaml.Node{match}
		if match.Kind == yaml.SequenceNode {
			nodes = match.Content
		}
		shadowed := false
		for _, m := range nodes {
			o.Match = append(o.Match, l.str(m))
			if s := o.Match[len(o.Match)-1]; strings.Contains(strings.TrimSuffix(s, "*"), "*") {
				l.errorf(m, "override match %q: '*' is a wildcard only at the end (\"premium:*\"); a match is a whole key or such a prefix", s)
				shadowed = true
				continue
			}
			// Rendered keys hold no brace and only the escapes their
			// rendering writes.
			if s := o.Match[len(o.Match)-1]; strings.ContainsAny(s, "{}") || !strings.HasSuffix(s, "*") && p.KeyEscapeProblem(s) != "" {
				l.errorf(m, "override match %q never applies: %s", s, p.KeyEscapeProblem(strings.TrimSuffix(s, "*")))
				shadowed = true
				continue
			}
			// Keys are grouped before overrides match them: a match
			// naming one address of a group would never apply.
			if s := o.Match[len(o.Match)-1]; !strings.HasSuffix(s, "*") {
				if g, ok := p.regroup(s); ok {
					l.errorf(m, "override match %q never applies: ipv6_prefix %d keys its address by group, as %q; match that", s, p.IPv6Prefix, g)
					shadowed = true
					continue
				}
			}
			// The first matching override wins, so a match an earlier
			// one already takes would never apply.
			for _, e := range earlier {
				if !shadows(e.match, o.Match[len(o.Match)-1]) {
					continue
				}
				if e.match == o.Match[len(o.Match)-1] {
					l.errorf(m, "duplicate override match %q (first at %s): the first override wins, so this one never applies; remove one", e.match, e.at)
				} else {
					l.errorf(m, "override match %q never applies: the earlier match %q (at %s) takes all its keys first; put this override before that one", o.Match[len(o.Match)-1], e.match, e.at)
				}
				shadowed = true
				break
			}
		}
		if shadowed {
			continue
		}
		if len(o.Match) == 0 {
			l.errorf(match, "override matches no key")
			continue
		}
		for i, m := range o.Match {
			earlier = append(earlier, seen{m, l.at(nodes[i])})
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

// shadows reports whether every key that override match b matches is
// matched by a: the same match, or a prefix a* that b's keys all start with.
func shadows(a, b string) bool {
	if prefix, ok := strings.CutSuffix(a, "*"); ok {
		return strings.HasPrefix(strings.TrimSuffix(b, "*"), prefix)
	}
	return a == b
}
