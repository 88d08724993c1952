package server

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/server/config"
	"github.com/sluicehq/sluice/storetest"
)

// t0 starts a day, so every fixed window the tests use (second to day)
// starts there too.
var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// fakeClock is a settable clock shared by the store and the service.
type fakeClock = storetest.Clock

func newFakeClock() *fakeClock { return storetest.NewClock(t0) }

func mustConfig(t testing.TB, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(strings.TrimLeft(yaml, "\n")))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// writeConfig writes a config file into the test's temporary directory.
func writeConfig(t testing.TB, yaml string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// newMemService returns a Service on a memory store driven by clock.
func newMemService(t testing.TB, yaml string, clock *fakeClock) *Service {
	t.Helper()
	store := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	return NewService(store, mustConfig(t, yaml), &ServiceOptions{Clock: clock.Now})
}

// newRedisService returns a Service on a Redis store over c, under the
// test's own prefix.
func newRedisService(t testing.TB, c redis.UniversalClient, yaml string) *Service {
	t.Helper()
	return NewService(redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)}), mustConfig(t, yaml), nil)
}

// serveRLS serves svc's RLS on a real loopback listener, on a gRPC server
// with opts, and returns a go-control-plane client.
func serveRLS(t testing.TB, svc *Service, opts ...grpc.ServerOption) rlsv3.RateLimitServiceClient {
	t.Helper()
	g := grpc.NewServer(opts...)
	svc.RegisterRLS(g)
	return rlsv3.NewRateLimitServiceClient(grpctest.Serve(t, g))
}

// dialRLS returns a go-control-plane client of the RLS at addr, closed at
// cleanup.
func dialRLS(t testing.TB, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	return rlsv3.NewRateLimitServiceClient(grpctest.Dial(t, addr))
}

// desc builds a descriptor from "k=v" pairs.
func desc(pairs ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for _, p := range pairs {
		k, v, _ := strings.Cut(p, "=")
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

func rlsRequest(domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

func call(t testing.TB, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// render renders a response as "OVERALL: code/remaining code/remaining ..."
// with "-" for a descriptor without a limit and "unl" for unlimited.
func render(r *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.OverallCode.String())
	b.WriteString(":")
	for _, s := range r.Statuses {
		b.WriteString(" ")
		switch {
		case s.LimitRemaining == 1<<32-1:
			b.WriteString("unl")
		case s.CurrentLimit == nil:
			b.WriteString(short(s.Code) + "/-")
		default:
			b.WriteString(short(s.Code) + "/" + itoa(int64(s.LimitRemaining)))
		}
	}
	return b.String()
}

func short(c rlsv3.RateLimitResponse_Code) string {
	if c == rlsv3.RateLimitResponse_OVER_LIMIT {
		return "OVER"
	}
	return c.String()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

var _ sluice.MultiStore = (*memory.Store)(nil)

// metricValue is the value of the series of name whose labels include
// labels (a histogram's sample count), or -1 when there is none.
func metricValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	if v, ok := promtest.Value(t, g, name, labels); ok {
		return v
	}
	return -1
}
