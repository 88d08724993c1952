package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
)

// InFlightRule bounds how many of one key's calls are in progress at once,
// across every process sharing the store (see httplimit.InFlightRule). A
// call over it fails with codes.ResourceExhausted, an errdetails.RetryInfo
// holding an estimate (see sluice.SlotDecision.RetryAfter) and an
// errdetails.QuotaFailure naming the rule. A stream holds its slot until
// its handler returns, the interceptor extending it every third of its
// hold or so meanwhile (so does a slow unary call).
type InFlightRule struct {
	Name   string                                             // unique among all the rules; required
	Limit  sluice.InFlightLimit                               // per key; Hold frees a dead process's slots (a running call's are extended); required
	Key    KeyFunc                                            // whom the call counts against; required
	Weight func(ctx context.Context, fullMethod string) int64 // slots per call, 1 to Limit.Max; default 1
	Match  func(ctx context.Context, fullMethod string) bool  // the calls the rule applies to; default all
}

// ShedRule sheds load by priority, fleet-wide (Capacity) or in this
// process (Workers), as httplimit.ShedRule does. A call shed fails with
// codes.Unavailable and an errdetails.RetryInfo: the client did nothing
// wrong.
type ShedRule struct {
	// Name identifies the rule, unique among the interceptor's rules of
	// every kind. Required.
	Name string
	// Capacity is the fleet's: the most weight in progress at once across
	// every process sharing the store. Set either Capacity or Workers:
	// New refuses a rule with neither or both (ErrInvalidConfig).
	Capacity sluice.InFlightLimit
	// Workers is this process's capacity. Set either Capacity or Workers.
	Workers int64
	// Reserve holds shares of the capacity for critical and normal calls.
	// Default: none.
	Reserve sluice.Reserve
	// Weight weighs a call in slots. Default: 1.
	Weight func(ctx context.Context, fullMethod string) int64
	// Match selects the calls the rule applies to. Default: all.
	Match func(ctx context.Context, fullMethod string) bool
}

// PriorityFunc says how important a call is, for ShedRules.
type PriorityFunc func(ctx context.Context, fullMethod string) sluice.Priority

// PriorityOptions configures PriorityMetadata, as httplimit.PriorityOptions
// does PriorityHeader: metadata believed only from TrustedProxies (the
// transport peer), every other call of priority Default ("normal" unless
// set).
type PriorityOptions = enforce.PriorityOptions

// PriorityMetadata returns a PriorityFunc reading the named incoming
// metadata ("critical", "normal" or "sheddable") from trusted proxies
// only, its last value (a proxy that appends has the last word). A bad
// value from a trusted proxy is the default priority, not an
// error. It fails with ErrInvalidConfig on a bad CIDR, or a Default that
// names no priority (then sluice.ErrInvalidPriority too).
func PriorityMetadata(name string, opts *PriorityOptions) (PriorityFunc, error) {
	if strings.TrimSpace(name) == "" {
		return nil, configError{errors.New("priority metadata key: no name")}
	}
	f, err := enforce.TrustedPriority("grpclimit", opts, peerAddr, func(c call) string {
		md, _ := metadata.FromIncomingContext(c.ctx)
		return enforce.LastValue(md.Get(name))
	})
	if err != nil {
		return nil, configError{err}
	}
	return fromSharedPriority(f), nil
}

// PriorityFrom returns a PriorityFunc reading the priority's name with
// key (say, ContextValue of the account's tier). ErrNoKey, another key
// error or a name that is no priority gives def ("" for "normal"). It
// fails with ErrInvalidConfig and sluice.ErrInvalidPriority when def
// names no priority.
func PriorityFrom(key KeyFunc, def string) (PriorityFunc, error) {
	if key == nil {
		return nil, fmt.Errorf("%w: PriorityFrom was given a nil KeyFunc", ErrInvalidConfig)
	}
	f, err := enforce.PriorityFrom("grpclimit", key.keyFunc(), def)
	if err != nil {
		return nil, configError{err}
	}
	return fromSharedPriority(f), nil
}

// configError is a construction error of the shared code, which names the
// package already, as one of ErrInvalidConfig: errors.Is finds both, and
// the message names the package once.
type configError struct{ err error }

func (e configError) Error() string {
	return ErrInvalidConfig.Error() + ": " + strings.TrimPrefix(e.err.Error(), "grpclimit: ")
}

func (e configError) Unwrap() []error { return []error{ErrInvalidConfig, e.err} }

func fromSharedPriority(f enforce.PriorityFunc[call]) PriorityFunc {
	if f == nil {
		return nil
	}
	return func(ctx context.Context, m string) sluice.Priority { return f(call{ctx, m}) }
}

// setupSlots prepares the in-flight and shedding rules of o, named apart
// from the rate rules.
func (in *Interceptor) setupSlots(store sluice.Store, rules []Rule, o *Options) error {
	var specs []enforce.SlotSpec[call]
	for _, r := range o.InFlight {
		specs = append(specs, r.spec())
	}
	for _, r := range o.Shed {
		specs = append(specs, r.spec())
	}
	slots, err := enforce.NewSlotRules(store, specs, o.Prefix, o.HashKey, o.Observer, ErrNoKey, len(rules), func(i int) string { return rules[i].Name })
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	slots.SetLogger(o.Logger)
	in.slots, in.priority = slots, o.Priority
	return nil
}

func (r InFlightRule) spec() enforce.SlotSpec[call] {
	return enforce.SlotSpec[call]{Name: r.Name, Limit: r.Limit, Key: r.Key.keyFunc(), Weight: weighed(r.Weight), Match: matched(r.Match)}
}

func (r ShedRule) spec() enforce.SlotSpec[call] {
	return enforce.SlotSpec[call]{Name: r.Name, Kind: enforce.Shed, Limit: r.Capacity, Workers: r.Workers,
		Reserve: r.Reserve, Weight: weighed(r.Weight), Match: matched(r.Match)}
}

// weighed and matched adapt a rule's functions to the shared rules.
func weighed(f func(context.Context, string) int64) func(call) int64 {
	if f == nil {
		return nil
	}
	return func(c call) int64 { return f(c.ctx, c.method) }
}

func matched(f func(context.Context, string) bool) func(call) bool {
	if f == nil {
		return nil
	}
	return func(c call) bool { return f(c.ctx, c.method) }
}

// acquire takes the call's in-flight slots; a non-nil error refuses it
// (md, if any, is the metadata to send with the refusal).
func (in *Interceptor) acquire(ctx context.Context, method string) (*enforce.Held, metadata.MD, error) {
	if in.slots.Len() == 0 || in.exempt != nil && in.exempt(ctx, method) {
		return nil, nil, nil
	}
	var p sluice.Priority // critical: no priority function sheds nothing early
	if in.priority != nil {
		p = in.priority(ctx, method)
	}
	h, v, err := in.slots.Acquire(ctx, call{ctx, method}, p)
	var (
		storeErr *enforce.StoreError
		cfgErr   *enforce.ConfigError
	)
	switch {
	case errors.As(err, &storeErr), errors.As(err, &cfgErr):
		return nil, nil, in.storeFailed(ctx, method, err)
	case err != nil:
		return nil, nil, in.misconfigured(method, err)
	case !v.Allowed:
		md := metadata.Pairs("retry-after", strconv.FormatInt(v.RetrySeconds(), 10))
		if v.Shed {
			return nil, md, refusal(codes.Unavailable, "grpclimit: "+v.Message(), v.Decision.RetryAfter, v.Policy, "")
		}
		return nil, md, refusal(codes.ResourceExhausted, "grpclimit: "+v.Message(), v.Decision.RetryAfter, v.Policy, "in-flight limit "+v.Decision.Limit.String()+" reached")
	}
	return h, nil, nil
}

// unaryHolding runs the unary call under its in-flight slots, released
// when the handler returns or panics (the panic goes on).
func (in *Interceptor) unaryHolding(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if ctx == nil || info == nil || handler == nil {
		return nil, status.Error(codes.Internal, "grpclimit: unary interceptor called with a nil context, info or handler")
	}
	h, md, err := in.acquire(ctx, info.FullMethod)
	if err != nil {
		if md != nil {
			grpc.SetHeader(ctx, md)
		}
		return nil, err
	}
	defer h.Release()
	return in.unary(ctx, req, info, handler)
}

// streamHolding runs the stream under its in-flight slots, held until the
// handler returns.
func (in *Interceptor) streamHolding(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if ss == nil || info == nil || handler == nil {
		return status.Error(codes.Internal, "grpclimit: stream interceptor called with a nil stream, info or handler")
	}
	if ss.Context() == nil {
		return status.Error(codes.Internal, "grpclimit: stream interceptor called with a stream whose context is nil")
	}
	h, md, err := in.acquire(ss.Context(), info.FullMethod)
	if err != nil {
		if md != nil {
			ss.SetHeader(md)
		}
		return err
	}
	defer h.Release()
	return in.stream(srv, ss, info, handler)
}
