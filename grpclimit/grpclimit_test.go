package grpclimit

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// serve starts a real gRPC server with the health service behind the
// interceptors on a loopback listener and returns a client.
func serve(t *testing.T, store sluice.Store, rules []Rule, opts *Options) healthpb.HealthClient {
	t.Helper()
	return serveHealth(t, store, rules, opts, health.NewServer())
}

// serveHealth is serve with svc as the health service.
func serveHealth(t *testing.T, store sluice.Store, rules []Rule, opts *Options, svc healthpb.HealthServer) healthpb.HealthClient {
	t.Helper()
	in, err := New(store, rules, opts)
	if err != nil {
		t.Fatal(err)
	}
	return healthOn(t, grpc.NewServer(grpc.UnaryInterceptor(in.Unary()), grpc.StreamInterceptor(in.Stream())), svc)
}

// healthOn registers svc on srv, serves srv on a loopback listener until
// the test ends, and returns a client of it.
func healthOn(t *testing.T, srv *grpc.Server, svc healthpb.HealthServer) healthpb.HealthClient {
	t.Helper()
	healthpb.RegisterHealthServer(srv, svc)
	return healthpb.NewHealthClient(grpctest.Serve(t, srv))
}

func fakeStore(t *testing.T) (*storetest.Clock, *memory.Store) {
	clk := storetest.NewClock(t0)
	s := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { s.Close() })
	return clk, s
}

func retryDelay(t *testing.T, err error) (time.Duration, string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		t.Fatalf("error %v: want ResourceExhausted", err)
	}
	var delay time.Duration = -1
	var subject string
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			delay = d.RetryDelay.AsDuration()
		case *errdetails.QuotaFailure:
			subject = d.Violations[0].Subject
		}
	}
	if delay < 0 {
		t.Fatalf("no RetryInfo in %v", st.Details())
	}
	return delay, subject
}

func TestUnary(t *testing.T) {
	t.Parallel()
	clk, store := fakeStore(t)
	client := serve(t, store, []Rule{{Name: "per-key", Limit: sluice.PerMinute(2), Key: Metadata("x-api-key")}}, &Options{Clock: clk.Now})
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k1")
	var header metadata.MD
	for i := range 2 {
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if got, want := strings.Join(header.Get("ratelimit"), ","), `"per-key";r=0;t=60`; got != want {
		t.Errorf("ratelimit metadata %q, want %q", got, want)
	}
	if got := header.Get("x-ratelimit-remaining"); len(got) != 0 {
		t.Errorf("allowed call carries x-ratelimit-remaining %q; the default is the standard fields only", got)
	}
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
	delay, subject := retryDelay(t, err)
	if delay != 30*time.Second || subject != "per-key" {
		t.Errorf("RetryInfo %v, QuotaFailure subject %q; want 30s, per-key", delay, subject)
	}
	if got := header.Get("retry-after"); len(got) != 1 || got[0] != "30" {
		t.Errorf("retry-after metadata %q", got)
	}
	// A caller that waits the RetryInfo delay is admitted.
	clk.Advance(delay)
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("after the retry delay: %v", err)
	}
	// Other keys, and calls without a key, are not affected.
	other := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k2")
	if _, err := client.Check(other, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("other key: %v", err)
	}
	if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("no key: %v", err)
	}
}

func TestAllowedHeaders(t *testing.T) {
	t.Parallel()
	for set, want := range map[httplimit.HeaderSet][]string{
		httplimit.StandardHeaders: {"ratelimit", "ratelimit-policy"},
		httplimit.AllHeaders:      {"ratelimit", "ratelimit-policy", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"},
		httplimit.NoHeaders:       nil,
	} {
		t.Run(set.String(), func(t *testing.T) {
			t.Parallel()
			clk, store := fakeStore(t)
			client := serve(t, store, []Rule{{Name: "per-key", Limit: sluice.PerMinute(2), Key: PeerIP()}}, &Options{Clock: clk.Now, AllowedHeaders: set})
			var header metadata.MD
			if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Header(&header)); err != nil {
				t.Fatal(err)
			}
			var got []string
			for k := range header {
				if strings.Contains(k, "ratelimit") || k == "retry-after" {
					got = append(got, k)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("allowed call's rate-limit metadata %q, want %q", got, want)
			}
		})
	}
}

func TestStream(t *testing.T) {
	t.Parallel()
	clk, store := fakeStore(t)
	client := serve(t, store, []Rule{{Name: "watch", Limit: sluice.PerMinute(1), Key: PeerIP(), Match: func(_ context.Context, m string) bool {
		return m == healthpb.Health_Watch_FullMethodName
	}}}, &Options{Clock: clk.Now})
	watch := func() error {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		_, err = stream.Recv()
		return err
	}
	if err := watch(); err != nil {
		t.Fatalf("first stream: %v", err)
	}
	err := watch()
	if delay, _ := retryDelay(t, err); delay != time.Minute {
		t.Errorf("RetryInfo %v, want 1m", delay)
	}
	// Unary calls do not match the rule.
	if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("unary: %v", err)
	}
}

// Layered: per peer and per method, all-or-nothing, with a shadow rule
// that never blocks.
func TestLayeredAndShadow(t *testing.T) {
	t.Parallel()
	clk, store := fakeStore(t)
	client := serve(t, store, []Rule{
		{Name: "peer", Limit: sluice.PerMinute(3), Key: PeerIP()},
		{Name: "method", Limit: sluice.PerMinute(100), Key: Method()},
		{Name: "dark", Limit: sluice.PerMinute(1), Key: Global(), Strategy: Shadow},
	}, &Options{Clock: clk.Now})
	for i := range 6 {
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if (err == nil) != (i < 3) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	d, err := store.Peek(context.Background(), "grpclimit:v3:method@406b20be:"+healthpb.Health_Check_FullMethodName, sluice.PerMinute(100), 1)
	if err != nil || d.Remaining != 97 {
		t.Errorf("method limit: %+v, %v; want 97 remaining (denied calls leak nothing)", d, err)
	}
}

func TestPenaltyAndDelay(t *testing.T) {
	t.Parallel()
	clk, store := fakeStore(t)
	client := serve(t, store, []Rule{{Name: "otp", Limit: sluice.PerMinute(1), Key: Global(), Strategy: Penalty, Penalty: time.Hour}}, &Options{Clock: clk.Now})
	if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	if delay, _ := retryDelay(t, err); delay != time.Hour {
		t.Errorf("penalty RetryInfo %v, want 1h", delay)
	}
	clk.Advance(2 * time.Minute)
	_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	if delay, _ := retryDelay(t, err); delay != 58*time.Minute {
		t.Errorf("during the block RetryInfo %v, want 58m", delay)
	}

	// Delay on real time: one per 50ms, held up to 5s.
	real := middlewaretest.Memory(t)
	client = serve(t, real, []Rule{{Name: "smooth", Limit: sluice.Limit{Rate: 20, Period: time.Second, Burst: 1}, Key: Global(), Strategy: Delay, MaxDelay: 5 * time.Second}}, nil)
	for i := range 3 {
		if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("delayed call %d: %v", i, err)
		}
	}
}

func TestRedis(t *testing.T) {
	t.Parallel()
	client := redistest.Client(t)
	clk := storetest.NewClock(time.Now().Truncate(time.Second))
	store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clk.Now})
	hc := serve(t, store, []Rule{
		{Name: "peer", Limit: sluice.PerMinute(2), Key: PeerIP()},
		{Name: "method", Limit: sluice.PerMinute(50), Key: Method()},
	}, &Options{Clock: clk.Now})
	for i := range 2 {
		if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	_, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
	delay, subject := retryDelay(t, err)
	if delay != 30*time.Second || subject != "peer" {
		t.Errorf("RetryInfo %v subject %q", delay, subject)
	}
	clk.Advance(delay)
	if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("after the delay: %v", err)
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	_, store := fakeStore(t)
	ok := Rule{Name: "ok", Limit: sluice.PerSecond(1), Key: Global()}
	for name, tt := range map[string]struct {
		store sluice.Store
		rules []Rule
	}{
		"nil store":   {nil, []Rule{ok}},
		"no rules":    {store, nil},
		"bad name":    {store, []Rule{{Name: "a\nb", Limit: ok.Limit, Key: Global()}}},
		"no key":      {store, []Rule{{Name: "k", Limit: ok.Limit}}},
		"bad limit":   {store, []Rule{{Name: "k", Key: Global()}}},
		"duplicate":   {store, []Rule{ok, ok}},
		"plain store": {plain{store}, []Rule{ok, {Name: "two", Limit: ok.Limit, Key: Global()}}},
	} {
		if _, err := New(tt.store, tt.rules, nil); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := New(store, []Rule{ok}, &Options{AllowedHeaders: httplimit.NoHeaders + 1}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("unknown header set: New = %v, want ErrInvalidConfig", err)
	}
	// The prefix's documented cap: 128 bytes.
	if _, err := New(store, []Rule{ok}, &Options{Prefix: strings.Repeat("p", 129)}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("129-byte prefix: New = %v, want ErrInvalidConfig", err)
	}
	if _, err := New(store, []Rule{ok}, &Options{Prefix: strings.Repeat("p", 128)}); err != nil {
		t.Errorf("128-byte prefix: %v", err)
	}
	if _, err := ClientIP(&IPOptions{TrustedProxies: []string{"x"}}); err == nil {
		t.Error("bad CIDR accepted")
	}
	// A key function error fails the call with Internal, a bad cost too.
	bad := serve(t, store, []Rule{{Name: "ctx", Limit: ok.Limit, Key: ContextValue(struct{}{})}}, nil)
	if _, err := bad.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("missing context value should skip the rule: %v", err)
	}
	cost := serve(t, store, []Rule{{Name: "cost", Limit: ok.Limit, Key: Global(), Cost: func(context.Context, string) int64 { return 0 }}}, nil)
	if _, err := cost.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Internal {
		t.Errorf("bad cost: %v, want Internal", err)
	}
}

type plain struct{ sluice.Store }

var errAny = errors.New("any error")

func TestKeyFuncs(t *testing.T) {
	t.Parallel()
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "k1", "x-forwarded-for", "198.51.100.1", "x-tag", "{t}50%"))
	m := "/pkg.Svc/Do"
	for name, tt := range map[string]struct {
		fn   KeyFunc
		want string
		err  error
	}{
		"metadata":         {Metadata("X-API-Key"), "k1", nil},
		"missing metadata": {Metadata("x-other"), "", ErrNoKey},
		// A client's braces would pick its key's Cluster slot.
		"metadata braces": {Metadata("x-tag"), "%7Bt%7D50%25", nil},
		"method":          {Method(), m, nil},
		"global":          {Global(), "*", nil},
		"compose":         {Compose(Metadata("x-api-key"), Method()), "2:k111:/pkg.Svc/Do", nil},
		"compose missing": {Compose(Metadata("x-other"), Method()), "", ErrNoKey},
	} {
		got, err := tt.fn(ctx, m)
		if !errors.Is(err, tt.err) || got != tt.want {
			t.Errorf("%s: %q, %v; want %q, %v", name, got, err, tt.want, tt.err)
		}
	}
	if _, err := PeerIP()(ctx, m); err == nil || errors.Is(err, ErrNoKey) {
		t.Errorf("no peer: %v, want an error", err)
	}
	if _, err := Compose(Method(), nil)(ctx, m); err == nil || errors.Is(err, ErrNoKey) {
		t.Errorf("compose nil: %v, want an error", err)
	}
	// ContextValue accepts what httplimit's does: strings, Stringers and
	// integers (one implementation serves both).
	type ctxKey struct{}
	for name, tt := range map[string]struct {
		v    any
		want string
		err  error // ErrNoKey, errAny or nil
	}{
		"string":     {"alice", "alice", nil},
		"empty":      {"", "", ErrNoKey},
		"missing":    {nil, "", ErrNoKey},
		"stringer":   {net.ParseIP("192.0.2.1"), "192.0.2.1", nil},
		"int":        {42, "42", nil},
		"int64":      {int64(-7), "-7", nil},
		"uint64":     {uint64(1) << 63, "9223372036854775808", nil},
		"wrong type": {3.5, "", errAny},
	} {
		c := context.WithValue(ctx, ctxKey{}, tt.v)
		got, err := ContextValue(ctxKey{})(c, m)
		switch {
		case tt.err == errAny:
			if err == nil || errors.Is(err, ErrNoKey) || !strings.HasPrefix(err.Error(), "grpclimit: ") {
				t.Errorf("context %s: %v, want a grpclimit error other than ErrNoKey", name, err)
			}
		case !errors.Is(err, tt.err) || got != tt.want:
			t.Errorf("context %s: %q, %v; want %q, %v", name, got, err, tt.want, tt.err)
		}
	}
	// x-forwarded-for counts only from a trusted proxy.
	withPeer := peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 5}})
	trusted, err := ClientIP(&IPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, tt := range map[string]struct {
		fn   KeyFunc
		want string
	}{"untrusted": {PeerIP(), "10.0.0.1"}, "trusted": {trusted, "198.51.100.1"}} {
		if got, err := tt.fn(withPeer, m); err != nil || got != tt.want {
			t.Errorf("%s: %q, %v; want %q", name, got, err, tt.want)
		}
	}
}

// A zero Interceptor has no rules: it passes every call through.
func TestZeroInterceptor(t *testing.T) {
	t.Parallel()
	var in Interceptor
	called := false
	_, err := in.Unary()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/pkg.Svc/Do"}, func(context.Context, any) (any, error) {
		called = true
		return nil, nil
	})
	if err != nil || !called {
		t.Errorf("zero Interceptor: handler called %v, err %v; want called, nil", called, err)
	}
}
