package httplimit

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/internal/problem"
)

// InFlightRule bounds how many of one key's requests are in progress at
// once, across every process sharing the store: "at most 20 requests per
// API key at the same time". A request over it is answered 429 with a
// problem+json body and a Retry-After that is an estimate (see
// sluice.SlotDecision.RetryAfter): a slot may free at any instant.
type InFlightRule struct {
	Name   string                    // in the 429 body and metrics, unique among all the rules; required
	Limit  sluice.InFlightLimit      // per key; Hold frees a dead process's slots (a running request's are extended every third of it or so); required
	Key    KeyFunc                   // whom the request counts against; required
	Weight func(*http.Request) int64 // slots per request, 1 to Limit.Max; default 1
	Match  func(*http.Request) bool  // the requests the rule applies to; default all
}

// ShedRule sheds load by priority: a capacity of requests in progress at
// once, of which shares are reserved for the more important priorities.
// A request of priority p is admitted while the weight in progress, its
// own included, fits under Capacity.Max × (1 − the shares reserved above
// p); critical requests may use it all. A request shed is answered 503
// with a problem+json body and Retry-After: the client did nothing wrong.
//
// With Capacity, the count is fleet-wide (one key on the store: fleet
// usage shedding). With Workers instead, it is this process's own count,
// kept in memory with no store call (worker utilisation shedding), for a
// process that knows how much it can serve at once.
type ShedRule struct {
	// Name identifies the rule in the 503 body and metrics, unique among
	// the middleware's rules of every kind. Required.
	Name string
	// Capacity is the fleet's: the most weight in progress at once across
	// every process sharing the store, each slot held at most Hold. Set
	// either Capacity or Workers: New refuses a rule with neither or both
	// (ErrInvalidConfig).
	Capacity sluice.InFlightLimit
	// Workers is this process's capacity: the most weight in progress at
	// once here. Set either Capacity or Workers.
	Workers int64
	// Reserve holds shares of the capacity for critical and normal
	// requests. Default: none (every priority may use it all).
	Reserve sluice.Reserve
	// Weight weighs a request in slots. Default: 1.
	Weight func(*http.Request) int64
	// Match selects the requests the rule applies to. Default: all.
	Match func(*http.Request) bool
}

// PriorityFunc says how important a request is, for ShedRules. Build one
// with PriorityHeader or PriorityFrom, or write one.
type PriorityFunc = enforce.PriorityFunc[*http.Request]

// PriorityOptions configures PriorityHeader: TrustedProxies, the CIDRs (or
// addresses) of the proxies whose priority header is believed (read only
// when the request's direct peer is one of them, so those proxies must set
// or remove it on every request; default none), and Default, the name of
// the priority every other request gets (default "normal", so no client
// promotes itself). A nil *PriorityOptions is valid: the header is never
// believed and every request is normal.
type PriorityOptions = enforce.PriorityOptions

// PriorityHeader returns a PriorityFunc reading the named request header
// ("critical", "normal" or "sheddable") from trusted proxies only, as
// PriorityOptions describes: its last value, so that a proxy that appends
// to the header rather than sets it still has the last word over the
// client. A bad value from a trusted proxy is the
// default priority, not an error: the proxy is ours to fix, the client
// should not pay for it. It fails with ErrInvalidConfig on a bad CIDR, or
// a Default that names no priority (then sluice.ErrInvalidPriority too).
func PriorityHeader(name string, opts *PriorityOptions) (PriorityFunc, error) {
	if strings.TrimSpace(name) == "" {
		return nil, configError{errors.New("priority header: no name")}
	}
	name = http.CanonicalHeaderKey(name)
	f, err := enforce.TrustedPriority("httplimit", opts, remoteAddr, func(r *http.Request) string {
		return enforce.LastValue(r.Header[name])
	})
	if err != nil {
		return nil, configError{err}
	}
	return f, nil
}

// PriorityFrom returns a PriorityFunc reading the priority's name with
// key, such as ContextValue(tierKey) after an authentication middleware
// has put the account's tier in the context. ErrNoKey, another key error
// or a name that is no priority gives def ("" for "normal"). It fails
// with ErrInvalidConfig and sluice.ErrInvalidPriority when def names no
// priority.
func PriorityFrom(key KeyFunc, def string) (PriorityFunc, error) {
	if key == nil {
		return nil, fmt.Errorf("%w: PriorityFrom was given a nil KeyFunc", ErrInvalidConfig)
	}
	f, err := enforce.PriorityFrom("httplimit", key, def)
	if err != nil {
		return nil, configError{err}
	}
	return f, nil
}

// configError is a construction error of the shared code, which names the
// package already, as one of ErrInvalidConfig: errors.Is finds both, and
// the message names the package once.
type configError struct{ err error }

func (e configError) Error() string {
	return ErrInvalidConfig.Error() + ": " + strings.TrimPrefix(e.err.Error(), "httplimit: ")
}

func (e configError) Unwrap() []error { return []error{ErrInvalidConfig, e.err} }

// setupSlots prepares the in-flight and shedding rules of o, named apart
// from the rate rules.
func (m *Middleware) setupSlots(store sluice.Store, rules []Rule, o *Options) error {
	specs := make([]enforce.SlotSpec[*http.Request], 0, len(o.InFlight)+len(o.Shed))
	for _, r := range o.InFlight {
		specs = append(specs, enforce.SlotSpec[*http.Request]{Name: r.Name, Limit: r.Limit, Key: r.Key, Weight: r.Weight, Match: r.Match})
	}
	for _, r := range o.Shed {
		specs = append(specs, enforce.SlotSpec[*http.Request]{Name: r.Name, Kind: enforce.Shed, Limit: r.Capacity, Workers: r.Workers,
			Reserve: r.Reserve, Weight: r.Weight, Match: r.Match})
	}
	var err error
	m.slots, err = enforce.NewSlotRules(store, specs, o.Prefix, o.HashKey, o.Observer, ErrNoKey, len(rules), func(i int) string { return rules[i].Name })
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	m.priority = o.Priority
	return nil
}

// acquire takes r's in-flight slots. When it returns ok false it has
// answered the request (a refusal or an error).
func (m *Middleware) acquire(w http.ResponseWriter, r *http.Request) (h *enforce.Held, ok bool) {
	if m.slots.Len() == 0 {
		return nil, true
	}
	var p sluice.Priority // critical: no priority function sheds nothing early
	if m.priority != nil {
		p = m.priority(r)
	}
	h, v, err := m.slots.Acquire(r.Context(), r, p)
	var (
		storeErr *enforce.StoreError
		cfgErr   *enforce.ConfigError
	)
	switch {
	case errors.As(err, &storeErr), errors.As(err, &cfgErr):
		m.onError(w, r, storeError(err))
	case err != nil:
		m.onError(w, r, fmt.Errorf("%w: %w", ErrKey, err))
	case !v.Allowed:
		refuseSlot(w, v)
	default:
		return h, true
	}
	return nil, false
}

// refuseSlot answers an in-flight refusal: 429 for a per-key limit, 503
// for load shedding, each with Retry-After and a problem+json body.
func refuseSlot(w http.ResponseWriter, v enforce.SlotVerdict) {
	status := http.StatusTooManyRequests
	if v.Shed {
		status = http.StatusServiceUnavailable
	}
	p := problem.New(status, v.Message())
	p.Policy, p.RetryAfter = v.Policy, v.RetrySeconds()
	w.Header().Set(HeaderRetryAfter, strconv.FormatInt(p.RetryAfter, 10))
	problem.Write(w, p)
}

// serveHolding serves r while h holds (and extends) its slots, releasing
// them when next returns or panics (the panic goes on), or, if next
// hijacks the connection, when the hijacked connection is closed.
func serveHolding(w http.ResponseWriter, r *http.Request, h *enforce.Held, next func(http.ResponseWriter, *http.Request)) {
	hw := &holdingWriter{ResponseWriter: w, held: h}
	defer func() {
		if !hw.hijacked.Load() {
			h.Release()
		}
	}()
	next(hw, r)
}

// holdingWriter is the ResponseWriter of a request holding slots. It
// unwraps to the server's (for http.ResponseController) and flushes and
// hijacks through it.
type holdingWriter struct {
	http.ResponseWriter
	held     *enforce.Held
	hijacked atomic.Bool
}

func (w *holdingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush flushes if the server's writer can.
func (w *holdingWriter) Flush() { _ = w.FlushError() }

// FlushError flushes through the server's writer and reports its error
// (http.ResponseController.Flush stops here), so that a streaming handler
// learns that its client has gone.
func (w *holdingWriter) FlushError() error {
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hijacks the connection, which then holds the request's slots
// until it is closed.
func (w *holdingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	w.hijacked.Store(true)
	return &holdingConn{Conn: c, held: w.held}, rw, nil
}

// holdingConn is a hijacked connection holding its request's slots.
type holdingConn struct {
	net.Conn
	held *enforce.Held
}

// Close closes the connection and releases the slots (once).
func (c *holdingConn) Close() error {
	err := c.Conn.Close()
	c.held.Release()
	return err
}
