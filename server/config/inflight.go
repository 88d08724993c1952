package config

import (
	"fmt"
	"io"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
)

// InFlight makes a policy an in-flight policy: it bounds how much weight
// of a key is in progress at once (the JSON API's acquire, extend and
// release) rather than how often requests start. In sluice's format:
//
//   - name: exports
//     key: "{user}"
//     in_flight:
//     max: 20        # the most weight held at once per key
//     hold: 30s      # a slot not released or extended is freed after it
//     reserve:       # optional: shares held back for the more important
//     critical: 0.2
//     normal: 0.3
//
// An in-flight policy has no rate fields (limit, algorithm, burst, cost,
// strategy, penalty, overrides). Envoy's rate limit service has no release
// call, so descriptors never match an in-flight policy.
type InFlight struct {
	// Limit is the per-key bound: Max weight held, each slot freed at the
	// latest Hold after it was acquired or last extended.
	Limit sluice.InFlightLimit
	// Reserve holds shares of Max back for critical and normal requests.
	// The zero Reserve reserves nothing.
	Reserve sluice.Reserve
}

// rateFields are the fields of a rate policy, which an in-flight policy
// must not have.
var rateFields = []string{"limit", "algorithm", "burst", "cost", "strategy", "penalty", "overrides", "lease", "ipv6_prefix"}

// inFlight reads an in-flight policy's in_flight mapping n into p; set are
// the policy's other fields by name. It reports false after an error.
func (l *loader) inFlight(p *Policy, n *yaml.Node, set map[string]*yaml.Node) bool {
	for _, f := range rateFields {
		if set[f] != nil {
			l.errorf(set[f], "policy %q is an in-flight policy: it takes no %s (in-flight policies bound requests in progress, not their rate)", p.Name, f)
			return false
		}
	}
	var max, hold, reserve *yaml.Node
	if !l.fields(n, map[string]**yaml.Node{"max": &max, "hold": &hold, "reserve": &reserve}) {
		return false
	}
	if max == nil || hold == nil {
		l.errorf(n, "policy %q: in_flight needs max (the most weight held at once) and hold (such as 30s)", p.Name)
		return false
	}
	f := &InFlight{}
	errs := len(l.errs)
	f.Limit.Max = l.integer(max, "max", 1, sluice.MaxInFlight)
	d, err := time.ParseDuration(l.str(hold))
	if err != nil || d < time.Microsecond || d > sluice.MaxHold {
		l.errorf(hold, "hold %q: want a duration between 1µs and %v (longer work extends its hold)", hold.Value, sluice.MaxHold)
	}
	f.Limit.Hold = d
	if reserve != nil {
		var critical, normal *yaml.Node
		if l.fields(reserve, map[string]**yaml.Node{"critical": &critical, "normal": &normal}) {
			f.Reserve.Critical = l.share(critical)
			f.Reserve.Normal = l.share(normal)
			if err := f.Reserve.Validate(); err != nil {
				l.errorf(reserve, "%v", err)
			}
		}
	}
	if len(l.errs) > errs {
		return false
	}
	p.InFlight = f
	return true
}

// share reads a reserved share, a number; nil is 0.
func (l *loader) share(n *yaml.Node) float64 {
	if n == nil {
		return 0
	}
	n = deref(n)
	var v float64
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!float" && n.Tag != "!!int") || n.Decode(&v) != nil {
		l.errorf(n, "want a share such as 0.2, got %s", kindName(n))
	}
	return v
}

// String describes an in-flight policy's bound: "20 in flight (hold 30s),
// reserve critical 0.2, normal 0.3".
func (f *InFlight) String() string {
	s := f.Limit.String()
	if f.Reserve != (sluice.Reserve{}) {
		s += fmt.Sprintf(", reserve critical %v, normal %v", f.Reserve.Critical, f.Reserve.Normal)
	}
	return s
}

// describeInFlight prints an in-flight policy's line for Describe.
func describeInFlight(w io.Writer, p *Policy) {
	fmt.Fprintf(w, "  policy %s: %s", p.Name, p.InFlight)
	if p.explicit {
		fmt.Fprintf(w, ", key %s", p.Key)
	}
	if p.ExposeKeys {
		fmt.Fprint(w, ", expose_keys")
	}
	fmt.Fprintln(w, "; JSON API only (acquire, extend, release), not offered over Envoy RLS")
}
