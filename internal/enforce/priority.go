package enforce

import (
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ipkey"
)

// PriorityFunc says how important a request of type R is, for Shed and
// Worker rules.
type PriorityFunc[R any] func(R) sluice.Priority

// DefaultPriority reads the name of the priority given to requests that
// carry none that can be believed: "" means "normal", so that no client
// promotes itself to critical by leaving the priority out, and none is
// demoted below what an ordinary request gets.
func DefaultPriority(pkg, name string) (sluice.Priority, error) {
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
// error included, or a name ParsePriority does not know gives def.
func PriorityFrom[R any](key KeyFunc[R], def sluice.Priority) PriorityFunc[R] {
	return func(r R) sluice.Priority {
		name, err := key(r)
		if err != nil {
			return def
		}
		p, err := sluice.ParsePriority(name)
		if err != nil {
			return def
		}
		return p
	}
}

// TrustedPriority returns a PriorityFunc for a priority that clients could
// forge, such as a header: value is read only when the direct peer (peer
// returns its "host:port") is one of the trusted proxies, as a forwarding
// header is for the client IP; every other request, and a trusted one
// whose value is missing or unknown, gets def. It fails on a bad CIDR.
func TrustedPriority[R any](pkg string, trusted []string, def sluice.Priority, peer func(R) (string, bool), value func(R) string) (PriorityFunc[R], error) {
	res, err := ipkey.New(trusted, "", 0, 0)
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
