package config

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/sluicehq/sluice/internal/enforce"
)

// Describe prints what the configuration holds, for check-config.
func (c *Config) Describe(w io.Writer) {
	fmt.Fprintf(w, "%s in %s\n", plural(len(c.Policies), "policy", "policies"), plural(len(c.domains), "domain", "domains"))
	for _, name := range c.Domains() {
		d := c.domains[name]
		fmt.Fprintf(w, "domain %s\n", name)
		d.root.describe(w, "  ")
		for _, p := range d.policies {
			if p.InFlight != nil {
				describeInFlight(w, p)
				continue
			}
			fmt.Fprintf(w, "  policy %s: %s", p.Name, p.Limit)
			if p.Cost != 1 {
				fmt.Fprintf(w, ", cost %d", p.Cost)
			}
			switch p.Strategy {
			case enforce.Shadow:
				fmt.Fprint(w, ", shadow")
			case enforce.Penalty:
				fmt.Fprintf(w, ", penalty %v", p.Penalty)
			}
			if p.explicit {
				fmt.Fprintf(w, ", key %s", p.Key)
			}
			if p.Lease > 0 {
				fmt.Fprintf(w, ", lease %v", p.Lease)
			}
			if p.IPv6Prefix > 0 {
				fmt.Fprintf(w, ", ipv6_prefix %d", p.IPv6Prefix)
			}
			if p.ExposeKeys {
				fmt.Fprint(w, ", expose_keys")
			}
			fmt.Fprintln(w)
			for _, o := range p.Overrides {
				fmt.Fprintf(w, "    override %s: %s\n", strings.Join(o.Match, ", "), o.Limit)
			}
		}
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
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
			case r.Unlimited:
				fmt.Fprint(w, ": unlimited")
			case r.Blocked:
				fmt.Fprintf(w, ": blocked (0 per %v)", r.Period)
			default:
				fmt.Fprintf(w, ": %s", r.Policy.Limit)
			}
			switch {
			case r.Quota:
				fmt.Fprint(w, ", quota_mode")
			case r.Shadow:
				fmt.Fprint(w, ", shadow_mode")
			}
			if r.Name != "" {
				fmt.Fprintf(w, ", name %s", r.Name)
			}
			if len(r.Replaces) > 0 {
				fmt.Fprintf(w, ", replaces %s", strings.Join(r.Replaces, ", "))
			}
		}
		if c.shareThreshold {
			fmt.Fprint(w, ", share_threshold")
		}
		if c.ipv6Prefix > 0 {
			fmt.Fprintf(w, ", ipv6_prefix %d", c.ipv6Prefix)
		}
		fmt.Fprintln(w)
		c.describe(w, indent+"  ")
	}
}
