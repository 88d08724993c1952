package enforce

import (
	"fmt"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ipkey"
)

// PriorityFunc says how important a request of type R is, for Shed and
// Worker rules.
type PriorityFunc[R any] func(R) sluice.Priority

// PriorityOptions configures a priority that clients could forge, read
// from a header or metadata. A nil *PriorityOptions is valid: the value is
// never believed and every request is normal.
type PriorityOptions struct {
	// TrustedProxies lists the CIDRs (or addresses) of the proxies whose
	// value is believed: it is read only when the request's direct peer
	// is one of them, so those proxies must set or remove it on every
	// request they pass on. Default: none.
	TrustedProxies []string
	// Default names the priority of every other request, and of a
	// trusted one whose value is missing or names no priority:
	// "critical", "normal" or "sheddable". Default: "normal", so that no
	// client promotes itself, nor is shed before ordinary traffic.
	Default string
}

// defaultPriority reads the name of the priority given to requests that
// carry none that can be believed: "" means "normal".
func defaultPriority(pkg, name string) (sluice.Priority, error) {
	if name == "" {
		return sluice.PriorityNormal, nil
	}
	p, err := sluice.ParsePriority(name)
	if err != nil {
		return 0, fmt.Errorf("%s: default priority: %w", pkg, err)
	}
	return p, nil
}

// PriorityFrom returns a PriorityFunc reading a priority's name with key
// (written by the server's own code, say an authentication middleware
// putting the account's tier in the context). A key error, its no-key
// error included, or a name ParsePriority does not know gives the
// priority def names ("" for normal). It fails when def names none.
func PriorityFrom[R any](pkg string, key KeyFunc[R], def string) (PriorityFunc[R], error) {
	if key == nil {
		return nil, fmt.Errorf("%s: PriorityFrom was given a nil KeyFunc", pkg)
	}
	d, err := defaultPriority(pkg, def)
	if err != nil {
		return nil, err
	}
	return func(r R) sluice.Priority {
		name, err := key(r)
		if err != nil {
			return d
		}
		p, err := sluice.ParsePriority(name)
		if err != nil {
			return d
		}
		return p
	}, nil
}

// TrustedPriority returns a PriorityFunc for a priority that clients could
// forge, such as a header: value is read only when the direct peer (peer
// returns its "host:port") is one of the trusted proxies, as a forwarding
// header is for the client IP; every other request, and a trusted one
// whose value is missing or unknown, gets the default (see
// PriorityOptions). It fails on a bad CIDR or a Default naming no
// priority.
// LastValue is the last value of a header (or metadata) whose lines may
// each be a comma-separated list: the one a trusted proxy that appends
// rather than sets wrote, after any the client sent. "" when there is none.
func LastValue(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	last := lines[len(lines)-1]
	if i := strings.LastIndexByte(last, ','); i >= 0 {
		last = last[i+1:]
	}
	return strings.TrimSpace(last)
}

func TrustedPriority[R any](pkg string, opts *PriorityOptions, peer func(R) (string, bool), value func(R) string) (PriorityFunc[R], error) {
	var o PriorityOptions
	if opts != nil {
		o = *opts
	}
	def, err := defaultPriority(pkg, o.Default)
	if err != nil {
		return nil, err
	}
	res, err := ipkey.New(o.TrustedProxies, "", 0, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pkg, err)
	}
	return func(r R) sluice.Priority {
		addr, ok := peer(r)
		if !ok {
			return def
		}
		a, err := ipkey.ParsePeer(addr)
		if err != nil || !res.Trusts(a.Unmap()) {
			return def
		}
		p, err := sluice.ParsePriority(value(r))
		if err != nil {
			return def
		}
		return p
	}, nil
}
