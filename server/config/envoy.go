package config

import (
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/internal/ipkey"
)

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

// maxRepeats bounds how many descriptors aliases repeat in one
// configuration; reading each takes microseconds and a policy.
const maxRepeats = 100_000

// descriptors loads envoyproxy/ratelimit's format into the tree under parent.
func (l *loader) descriptors(d *Domain, parent *descNode, path string, list *yaml.Node) {
	list = deref(list)
	if l.reading[list] {
		l.errorf(list, "descriptors: an alias names a list of descriptors that holds it: its tree would never end")
		return
	}
	l.reading[list] = true
	defer delete(l.reading, list)
	for _, n := range l.seq(list) {
		if l.repeats > maxRepeats {
			return
		}
		if l.read[n] {
			// Lists aliased into lists repeat their descriptors: a few
			// dozen lines could make billions.
			if l.repeats++; l.repeats > maxRepeats {
				l.errorf(n, "descriptors: aliases repeat more than %d descriptors: write the tree out, or repeat fewer of its levels", maxRepeats)
				return
			}
		}
		l.read[n] = true
		var key, value, rateLimit, children, shadow, quota, detailed, valueToMetric, share, metadata, ipv6 *yaml.Node
		if !l.fields(n, map[string]**yaml.Node{
			"key": &key, "value": &value, "rate_limit": &rateLimit, "descriptors": &children,
			"shadow_mode": &shadow, "quota_mode": &quota, "detailed_metric": &detailed,
			"value_to_metric": &valueToMetric, "share_threshold": &share, "metadata": &metadata,
			"ipv6_prefix": &ipv6, // sluice's own: envoyproxy/ratelimit keys every value as sent
		}) {
			continue
		}
		if key == nil || key.Value == "" {
			l.errorf(n, "descriptor has empty key")
			continue
		}
		// A field written with no value is left out, as envoyproxy/ratelimit's
		// reader takes it (its zero value): "rate_limit:" sets no limit.
		// Booleans stay strict: an empty one is an error naming it.
		value, rateLimit, metadata = notNull(value), notNull(rateLimit), notNull(metadata)
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
			l.boolean(detailed, "detailed_metric") // metrics detail: accepted, the Prometheus labels are per policy
		}
		if valueToMetric != nil {
			l.boolean(valueToMetric, "value_to_metric")
		}
		if metadata != nil && metadata.Kind != yaml.MappingNode {
			// Envoy's dynamic metadata for the descriptor: accepted, not sent
			l.errorf(metadata, "metadata wants a mapping, got %s", kindName(metadata))
		}
		wildcard := strings.Contains(ek.value, "*")
		if share != nil && l.boolean(share, "share_threshold") {
			if !wildcard {
				l.errorf(share, "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", finalKey)
			}
			dn.shareThreshold = true
		}
		if ipv6 != nil {
			if ek.value != "" && !wildcard {
				l.errorf(ipv6, "ipv6_prefix groups the addresses a descriptor matches, but '%s' matches the value %q only: put it on the descriptor without a value (or with a wildcard one)", finalKey, ek.value)
			} else {
				dn.ipv6Prefix, dn.ipGroup = l.ipv6Prefix(ipv6)
			}
		}
		shadowMode := shadow != nil && l.boolean(shadow, "shadow_mode")
		quotaMode := quota != nil && l.boolean(quota, "quota_mode")
		if rateLimit != nil {
			l.rateLimit(d, dn, name, rateLimit, shadowMode, quotaMode)
		}
		if _, dup := parent.children[ek]; dup {
			l.errorf(n, "duplicate descriptor composite key '%s'", name)
			continue
		}
		parent.children[ek] = dn
		if wildcard {
			parent.wildcards = append(parent.wildcards, newWildcard(ek))
		}
		if children != nil {
			l.descriptors(d, dn, name, children)
		}
	}
}

// notNull returns n, or nil for a YAML null.
func notNull(n *yaml.Node) *yaml.Node {
	if n != nil && n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	return n
}

func (l *loader) rateLimit(d *Domain, dn *descNode, name string, n *yaml.Node, shadow, quota bool) {
	var unit, rpu, unlimited, rname, replaces, alg, mult, lease *yaml.Node
	if !l.fieldsOffering(n, map[string]**yaml.Node{
		"unit": &unit, "requests_per_unit": &rpu, "unlimited": &unlimited,
		"name": &rname, "replaces": &replaces, "algorithm": &alg, "unit_multiplier": &mult,
		"lease": &lease,
	}, map[string]bool{"lease": true}) {
		return
	}
	rname, alg, mult = notNull(rname), notNull(alg), notNull(mult)
	if lease != nil {
		// Envoy's format stays what envoyproxy/ratelimit reads, exact.
		l.errorf(lease, "lease: Envoy-format limits are exact; write the limit as a sluice-format policy to lease it")
		return
	}
	r := &RateLimit{Shadow: shadow || quota, Quota: quota && !shadow, Path: name}
	if rname != nil {
		r.Name = l.str(rname)
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
		if rn.Value == r.Name {
			l.errorf(rn, "replaces should not contain name of same descriptor")
			continue
		}
		r.Replaces = append(r.Replaces, rn.Value)
	}
	var period time.Duration
	if unit != nil {
		period = envoyUnits[strings.ToLower(l.str(unit))]
	}
	if unlimited != nil && l.boolean(unlimited, "unlimited") {
		if period != 0 {
			l.errorf(unit, "should not specify rate limit unit when unlimited")
		}
		r.Unlimited = true
		dn.rule = r
		return
	}
	if period == 0 {
		v := ""
		if unit != nil {
			v = unit.Value
		}
		l.errorf(orNode(unit, n), "invalid rate limit unit '%s': want second, minute, hour, day, week, month or year", v)
		return
	}
	r.Unit = period
	if mult != nil {
		// As envoyproxy/ratelimit's unit_multiplier: the window is unit×N,
		// aligned, like every fixed window, on multiples of it since the
		// Unix epoch.
		errs := len(l.errs)
		m := l.integer(mult, "unit_multiplier", 0, 1<<32-1)
		if len(l.errs) > errs {
			return // said why
		}
		if m == 0 {
			l.errorf(mult, "invalid unit multiplier of 0")
			return
		}
		if m > int64(sluice.MaxPeriod/period) {
			l.errorf(mult, "unit_multiplier %d makes a window longer than %v", m, sluice.MaxPeriod)
			return
		}
		period *= time.Duration(m)
	}
	var perUnit int64
	if rpu != nil {
		perUnit = l.integer(rpu, "requests_per_unit", 0, 1<<32-1)
	}
	if perUnit == 0 { // envoyproxy/ratelimit's "block everything" (Example 3)
		r.Blocked = true
		r.Period = period
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
	r.Period = period
	p := &Policy{Name: name, Limit: lim, Cost: 1, Domain: d.name, envoy: true, pos: l.at(n)}
	if shadow || quota { // neither ever refuses a request
		p.Strategy = enforce.Shadow
	}
	if !l.addPolicy(p, n) {
		return
	}
	r.Policy = p
	dn.rule = r
}

// ipv6Prefix reads an ipv6_prefix field (1 to 128): the prefix length and
// the resolver that groups addresses by it.
func (l *loader) ipv6Prefix(n *yaml.Node) (int, *ipkey.Resolver) {
	bits := int(l.integer(n, "ipv6_prefix", 1, 128))
	r, err := ipkey.New(nil, "", 0, bits)
	if err != nil { // cannot happen: bits is in range
		l.errorf(n, "ipv6_prefix: %v", err)
		return 0, nil
	}
	return bits, r
}
