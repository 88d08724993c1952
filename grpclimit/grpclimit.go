// Package grpclimit puts gRPC servers behind sluice rate limits, with the
// same rules, strategies and all-or-nothing layering as package httplimit.
//
// A denied call fails with codes.ResourceExhausted carrying an
// errdetails.RetryInfo (how long to wait) and an errdetails.QuotaFailure
// naming the violated policy; its response header metadata carries the
// rate-limit fields of the HTTP middleware (httplimit.SetHeaders) in lower case ("retry-after",
// "ratelimit", "ratelimit-policy", ...). Allowed calls carry "ratelimit"
// and "ratelimit-policy" (see Options.AllowedHeaders). Stream calls are
// checked once, when the stream opens.
//
// A call whose Cost exceeds its rule's capacity (the burst) could never be
// admitted: it fails at once with codes.ResourceExhausted, a message
// giving the cost and the capacity and a QuotaFailure, but no RetryInfo
// and no "retry-after" or "ratelimit" metadata, since waiting will not
// help. It takes nothing from any rule and starts no Penalty block. The
// answer does not depend on the store: when the store fails, it is the
// same, without the "x-ratelimit-remaining" and "x-ratelimit-reset" that
// only the store knows.
//
// In-flight and shedding rules (Options.InFlight, Options.Shed) work as in
// httplimit: a call, unary or stream, holds its slots until its handler
// returns; refusals are codes.ResourceExhausted (per key) or
// codes.Unavailable (shed), each with an errdetails.RetryInfo.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/internal/header"
	"github.com/sluicehq/sluice/internal/logpace"
	"github.com/sluicehq/sluice/internal/problem"
)

// HeaderSet selects the rate-limit metadata of allowed calls; denied calls
// carry every field. It is httplimit.HeaderSet: either package's constants
// fit.
type HeaderSet = header.Selection

// Header sets.
const (
	// StandardHeaders: "ratelimit" and "ratelimit-policy". The default.
	StandardHeaders = header.Standard
	// AllHeaders adds the "x-ratelimit-*" fields.
	AllHeaders = header.All
	// NoHeaders leaves allowed calls' metadata untouched.
	NoHeaders = header.None
)

// Strategy is what a rule does with a call over its limit; see httplimit.
type Strategy = enforce.Strategy

// Strategies, as in httplimit.
const (
	Reject  = enforce.Reject
	Delay   = enforce.Delay
	Shadow  = enforce.Shadow
	Penalty = enforce.Penalty
)

// Errors. Construction errors wrap ErrInvalidConfig.
var ErrInvalidConfig = errors.New("grpclimit: invalid configuration")

// Rule is one rate-limit policy for the calls it matches.
type Rule struct {
	// Name identifies the policy in metadata, status details and metrics:
	// 1 to 1024 bytes of UTF-8 text without control characters, unique.
	// Required.
	Name string
	// Limit is the policy's limit. Required.
	Limit sluice.Limit
	// Key says whom the call is counted against. Required.
	Key KeyFunc
	// Cost weighs a call. Below 1 it fails the call (Internal, with the
	// detail logged: see Options.Logger); above
	// Limit.Capacity() the call can never be admitted and fails with
	// ResourceExhausted without a RetryInfo, taking nothing (see the
	// package doc). Default: 1.
	Cost func(ctx context.Context, fullMethod string) int64
	// Match selects the calls the rule applies to, by full method name
	// ("/pkg.Service/Method"). Default: all.
	Match func(ctx context.Context, fullMethod string) bool
	// Strategy applies over the limit. Default: Reject.
	Strategy Strategy
	// MaxDelay is the longest a Delay rule holds a call. A call that would
	// need longer, or longer than its deadline allows, behind the calls
	// this process already holds on its key, is rejected at once with
	// ResourceExhausted (see httplimit.Delay for the bound). A call whose
	// context ends while held gets its context's code and is no denial.
	MaxDelay time.Duration
	// MaxWaiting is the most calls a Delay rule holds at once in this
	// process; past it, calls over the limit are rejected at once.
	// Default: 1024. Under Reject or Penalty it is refused (New fails),
	// not ignored.
	MaxWaiting int
	// Penalty is how long a Penalty rule blocks a key after a violation.
	// Set under Reject or Delay it is refused (New fails), not ignored, as
	// MaxDelay is under Reject or Penalty.
	Penalty time.Duration
}

// Options configures an Interceptor. A nil *Options is valid.
type Options struct {
	// Prefix starts every store key, laid out as httplimit's (see
	// httplimit.Options.Prefix). At most 128 bytes: New fails with
	// ErrInvalidConfig for a longer one. Default: "grpclimit:".
	Prefix string
	// HashKey, when set, replaces every key with its HMAC-SHA-256 under this
	// secret. Default: none.
	HashKey []byte
	// Exempt exempts calls from every rule (health checks, reflection).
	// Default: none.
	Exempt func(ctx context.Context, fullMethod string) bool
	// AllowedHeaders selects the rate-limit metadata of allowed calls, as
	// for httplimit; denied calls always carry every field. Default:
	// StandardHeaders ("ratelimit" and "ratelimit-policy").
	AllowedHeaders HeaderSet
	// Observer receives every rule's decisions. Default: none.
	Observer sluice.Observer
	// Clock anchors x-ratelimit-reset. Default: time.Now.
	Clock func() time.Time
	// InFlight bounds calls in progress per key (see InFlightRule). They
	// need a store implementing sluice.Slots. Default: none.
	InFlight []InFlightRule
	// Shed sheds load by priority (see ShedRule). Default: none.
	Shed []ShedRule
	// Priority says how important a call is, for Shed rules. Default: nil,
	// every call critical (a ShedRule is then a plain capacity).
	Priority PriorityFunc
	// Logger receives why a rule could not decide a call (its key
	// function failed, its Cost was below 1, its Weight outside 1..Max,
	// the store refused its limit):
	// the client gets Internal "grpclimit: rate limiter misconfigured"
	// only. Per rule and kind of failure, one line at ERROR at once, then
	// at most one a minute: the latest call held back, with the number of
	// the others (calls_not_logged), written when the minute ends.
	// Default: slog.Default().
	Logger *slog.Logger
}

// Interceptor enforces Rules on gRPC calls. Build one with New and install
// Unary and Stream on a grpc.Server. It is safe for concurrent use. The
// zero value has no rules: it passes every call through. A nil
// *Interceptor (New's error ignored) fails every call with codes.Internal
// naming the cause, never passing it through unlimited.
//
// In-flight and shedding rules (Options.InFlight, Options.Shed) are
// checked first: a call acquires their slots before its rate rules take
// any units, and a rate denial releases them; a call holds its slots
// until its handler returns (or panics).
type Interceptor struct {
	rules    *enforce.Rules[call]
	slots    *enforce.SlotRules[call]
	priority PriorityFunc
	exempt   func(context.Context, string) bool
	allowed  HeaderSet
	clock    func() time.Time
	failures failureLog
}

// New returns an Interceptor enforcing rules on store. Layered limits need
// a sluice.MultiStore (memory and Redis stores are). A store that is a
// sluice.LimitChecker (a lease store) checks here every limit a rule
// uses, a Penalty rule's block included, so that a limit it refuses for
// every key fails New rather than every request. So does a store never
// built (a zero or nil-pointer store: see sluice.CheckBuilt).
func New(store sluice.Store, rules []Rule, opts *Options) (*Interceptor, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = "grpclimit:"
	}
	if o.AllowedHeaders > NoHeaders {
		return nil, fmt.Errorf("%w: unknown AllowedHeaders %v", ErrInvalidConfig, o.AllowedHeaders)
	}
	specs := make([]enforce.Spec[call], len(rules))
	for i, r := range rules {
		specs[i] = enforce.Spec[call]{
			Rule: enforce.Rule{Name: r.Name, Limit: r.Limit, Strategy: r.Strategy, MaxDelay: r.MaxDelay, MaxWaiting: r.MaxWaiting, Penalty: r.Penalty},
			Key:  r.Key.keyFunc(), Cost: weighed(r.Cost), Match: matched(r.Match),
		}
	}
	var rs *enforce.Rules[call]
	if len(rules) > 0 || len(o.InFlight)+len(o.Shed) == 0 {
		var err error
		if rs, err = enforce.NewRules(store, specs, o.Prefix, o.HashKey, o.Observer, ErrNoKey); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	in := &Interceptor{
		rules:    rs,
		exempt:   o.Exempt,
		allowed:  o.AllowedHeaders,
		clock:    o.Clock,
		failures: failureLog{logger: o.Logger},
	}
	if in.clock == nil {
		in.clock = time.Now
	}
	if err := in.setupSlots(store, rules, &o); err != nil {
		return nil, err
	}
	return in, nil
}

// Unary returns the unary server interceptor. A call acquires its
// in-flight slots first, then takes its rate units. A nil context, info or
// handler fails the call with codes.Internal.
func (in *Interceptor) Unary() grpc.UnaryServerInterceptor {
	if in == nil {
		return func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) { return nil, errNil }
	}
	return in.unaryHolding
}

// errNil fails the calls through a nil *Interceptor.
var errNil = status.Error(codes.Internal, "grpclimit: nil *grpclimit.Interceptor (New failed?)")

func (in *Interceptor) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, err := in.check(ctx, info.FullMethod)
	if md != nil {
		grpc.SetHeader(ctx, md) // best effort: fails only if headers were already sent
	}
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// Stream returns the stream server interceptor. A stream is checked once,
// when it opens, at the rule's cost; it holds its in-flight slots until
// its handler returns. A nil stream, info or handler, or a stream whose
// Context is nil, fails the call with codes.Internal.
func (in *Interceptor) Stream() grpc.StreamServerInterceptor {
	if in == nil {
		return func(any, grpc.ServerStream, *grpc.StreamServerInfo, grpc.StreamHandler) error { return errNil }
	}
	return in.streamHolding
}

func (in *Interceptor) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	md, err := in.check(ss.Context(), info.FullMethod)
	if md != nil {
		ss.SetHeader(md)
	}
	if err != nil {
		return err
	}
	return handler(srv, ss)
}

// check decides a call: a nil error admits it. md is the rate-limit
// metadata to send, if any.
func (in *Interceptor) check(ctx context.Context, method string) (metadata.MD, error) {
	if in.exempt != nil && in.exempt(ctx, method) {
		return nil, nil
	}
	var buf [4]enforce.Check
	checks, err := in.rules.Collect(call{ctx, method}, buf[:0])
	if err != nil {
		return nil, in.misconfigured(method, err)
	}
	if len(checks) == 0 {
		return nil, nil
	}
	v, err := in.rules.Enforce(ctx, checks)
	if err != nil {
		return nil, in.storeFailed(ctx, method, err)
	}
	if v.Abandoned { // its context ended while held: its own code, no denial
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	noWait := !v.Allowed && enforce.Never(&checks[v.Report])
	var md metadata.MD
	if v.Report >= 0 && (!v.Allowed || in.allowed != NoHeaders) {
		md = headers(in.allowed, checks[v.Report].Rule.Name, v.Decision, in.clock(), noWait, v.Blind)
	}
	if v.Allowed {
		return md, nil
	}
	c := &checks[v.Report]
	if noWait {
		return md, never(c.Rule.Name, c.Cost, c.Rule.Limit)
	}
	return md, denial(c.Rule.Name, v.Decision)
}

// errMisconfigured fails a call a rule could not key or weigh. It names
// neither the rule nor the error, which are the server's business (as
// httplimit's 500): they go to the log.
var errMisconfigured = status.Error(codes.Internal, "grpclimit: rate limiter misconfigured")

// misconfigured logs why a rule could not decide the call (err names the
// rule) and returns the status the client gets.
func (in *Interceptor) misconfigured(method string, err error) error {
	msg := "grpclimit: rule cannot key call"
	switch {
	case errors.As(err, new(*enforce.ConfigError)):
		msg = "grpclimit: store refuses rule"
	case errors.Is(err, sluice.ErrInvalidCost) || errors.Is(err, sluice.ErrInvalidWeight):
		msg = "grpclimit: rule cannot weigh call"
	}
	in.failures.log(msg, method, err)
	return errMisconfigured
}

// failureLog logs the calls rules could not decide, paced per rule and
// kind of failure (see logpace): a broken Cost function failing every
// call does not flood the log, one rule's failures do not hide
// another's, and the calls held back are counted when the minute ends.
type failureLog struct {
	logger *slog.Logger
	pace   logpace.Pacer
}

func (f *failureLog) log(msg, method string, err error) {
	f.pace.Log(msg+"\x00"+failedRule(err), func(notLogged int64) {
		logger := f.logger
		if logger == nil {
			logger = slog.Default()
		}
		logger.Error(msg, "method", method, "error", err.Error(), "calls_not_logged", notLogged)
	})
}

// failedRule names the rules of err, a rule's failure to decide a call:
// its ConfigError's policies, or the rule its text starts with ("rule
// \"name\": ..."). Never the rest of the text, which may be a key's.
func failedRule(err error) string {
	if cfg := (*enforce.ConfigError)(nil); errors.As(err, &cfg) {
		return strings.Join(cfg.Policies, "\x00")
	}
	if rest, ok := strings.CutPrefix(err.Error(), "rule "); ok {
		if q, err := strconv.QuotedPrefix(rest); err == nil {
			return q
		}
	}
	return ""
}

// never is the ResourceExhausted status for a call whose cost exceeds its
// rule's capacity: a QuotaFailure naming the policy, and no RetryInfo.
func never(policy string, cost int64, limit sluice.Limit) error {
	st := status.New(codes.ResourceExhausted, "grpclimit: "+problem.NeverDetail(policy, cost, limit.Capacity()))
	withDetails, err := st.WithDetails(&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		Subject:     policy,
		Description: "cost " + strconv.FormatInt(cost, 10) + " exceeds the capacity of rate limit " + limit.String(),
	}}})
	if err != nil { // cannot happen: the detail is a well-formed message
		return st.Err()
	}
	return withDetails.Err()
}

// headers is HeaderSet.Set as gRPC metadata (lower-case keys), less what
// a denial no wait admits must not say (header.OmitNever) when noWait.
func headers(set HeaderSet, policy string, d sluice.Decision, now time.Time, noWait, blind bool) metadata.MD {
	h := http.Header{}
	set.Set(h, policy, d, now)
	if noWait {
		header.OmitNever(h, blind)
	}
	md := make(metadata.MD, len(h))
	for k, v := range h {
		md[strings.ToLower(k)] = v
	}
	return md
}

// denial is the ResourceExhausted status for a denied call.
func denial(policy string, d sluice.Decision) error {
	secs := max(header.CeilSeconds(d.RetryAfter), 1)
	msg := "grpclimit: rate limit " + strconv.Quote(policy) + " exceeded; retry in " + strconv.FormatInt(secs, 10) + "s"
	return refusal(codes.ResourceExhausted, msg, d.RetryAfter, policy, "rate limit "+d.Limit.String()+" exceeded")
}

// refusal is a status of code with a RetryInfo and, when violation is
// set, a QuotaFailure naming the policy.
func refusal(code codes.Code, msg string, retry time.Duration, policy, violation string) error {
	st := status.New(code, msg)
	details := []protoadapt.MessageV1{&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}}
	if violation != "" {
		details = append(details, &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject:     policy,
			Description: violation,
		}}})
	}
	withDetails, err := st.WithDetails(details...)
	if err != nil { // cannot happen: the details are well-formed messages
		return st.Err()
	}
	return withDetails.Err()
}

// storeFailed is the status of a call whose store call failed with err:
// misconfigured's when the store refused what a rule asks of it (no retry
// mends it), else unavailable's.
func (in *Interceptor) storeFailed(ctx context.Context, method string, err error) error {
	if errors.As(err, new(*enforce.ConfigError)) {
		return in.misconfigured(method, err)
	}
	return unavailable(ctx)
}

// unavailable is the status of a call the store could not decide: its
// context's own error when that ended (the client canceled, or its
// deadline passed), else Unavailable with a RetryInfo of a second, as
// httplimit's Retry-After.
func unavailable(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	return refusal(codes.Unavailable, "grpclimit: rate limiter unavailable", time.Second, "", "")
}
