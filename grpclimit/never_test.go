package grpclimit

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// costMetadata is the call's cost, from its x-cost metadata.
func costMetadata(ctx context.Context, _ string) int64 {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-cost"); len(v) == 1 {
		n, _ := strconv.ParseInt(v[0], 10, 64)
		return n
	}
	return 1
}

// A call costing more than its rule's capacity fails with ResourceExhausted
// saying it can never be admitted, with no RetryInfo and no retry-after
// metadata, and takes nothing: not from its rule, nor from a layered one, and
// it starts no Penalty block; a Delay rule does not hold it. On Redis, over a
// real listener.
func TestRedisCostOverCapacity(t *testing.T) {
	t.Parallel()
	client := redistest.Client(t)
	for _, st := range []Strategy{Reject, Delay, Penalty} {
		t.Run(st.String(), func(t *testing.T) {
			t.Parallel()
			store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
			hc := serve(t, store, []Rule{
				{Name: "account", Limit: sluice.PerHour(1), Key: Metadata("x-account")},
				{Name: "big", Limit: sluice.PerMinute(10), Key: PeerIP(), Cost: costMetadata, Strategy: st, MaxDelay: onlyFor(st, Delay), Penalty: onlyFor(st, Penalty)},
			}, nil)
			call := func(cost int, md *metadata.MD) error {
				ctx := metadata.AppendToOutgoingContext(context.Background(), "x-cost", strconv.Itoa(cost), "x-account", "acme")
				_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(md))
				return err
			}
			var md metadata.MD
			start := time.Now()
			err := call(11, &md)
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("answered after %v: held", took)
			}
			s, _ := status.FromError(err)
			if s.Code() != codes.ResourceExhausted {
				t.Fatalf("cost 11 of 10: %v, want ResourceExhausted", err)
			}
			for _, w := range []string{"costs 11 units", `"big"`, "more than 10", "never be allowed"} {
				if !strings.Contains(s.Message(), w) {
					t.Errorf("message %q does not say %q", s.Message(), w)
				}
			}
			var quota *errdetails.QuotaFailure
			for _, d := range s.Details() {
				switch d := d.(type) {
				case *errdetails.RetryInfo:
					t.Errorf("RetryInfo %v: no wait admits the call", d)
				case *errdetails.QuotaFailure:
					quota = d
				}
			}
			if quota == nil || quota.Violations[0].Subject != "big" || !strings.Contains(quota.Violations[0].Description, "cost 11") {
				t.Errorf("QuotaFailure %v", quota)
			}
			for _, k := range []string{"retry-after", "ratelimit"} {
				if v := md.Get(k); len(v) != 0 {
					t.Errorf("%s metadata %q, want none", k, v)
				}
			}
			if got := md.Get("ratelimit-policy"); len(got) != 1 || got[0] != `"big";q=10;w=60` {
				t.Errorf("ratelimit-policy %q", got)
			}
			// Nothing was taken: the whole capacity, and the account's one
			// unit an hour, are there, and no block stands.
			if err := call(10, &md); err != nil {
				t.Errorf("cost 10 after the refusal: %v", err)
			}
			if delay, subject := retryDelay(t, call(1, &md)); delay <= 0 || subject == "" {
				t.Errorf("over the limit: RetryInfo %v, subject %q", delay, subject)
			}
		})
	}
}

// onlyFor is an hour under strategy want and 0 under st otherwise: a
// rule's MaxDelay and Penalty are refused under other strategies.
func onlyFor(st, want Strategy) time.Duration {
	if st == want {
		return time.Hour
	}
	return 0
}

// A call costing more than its rule's capacity fails ResourceExhausted
// whatever the store says: with Redis down and no failure policy too,
// without the figures the store would have given, while a call the store
// must decide is Unavailable.
func TestRedisDownCostOverCapacity(t *testing.T) {
	t.Parallel()
	client := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
	cost := func(ctx context.Context, _ string) int64 {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-cost"); len(v) > 0 {
			n, _ := strconv.ParseInt(v[0], 10, 64)
			return n
		}
		return 1
	}
	hc := serve(t, store, []Rule{{Name: "big", Limit: sluice.PerMinute(10), Key: Global(), Cost: cost}}, &Options{AllowedHeaders: AllHeaders})
	var hdr metadata.MD
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-cost", "11")
	_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr))
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("cost 11 of 10, Redis down: %v, want ResourceExhausted", err)
	}
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			t.Errorf("a RetryInfo %v", d)
		}
	}
	for _, k := range []string{"retry-after", "ratelimit", "x-ratelimit-remaining", "x-ratelimit-reset"} {
		if v := hdr.Get(k); len(v) > 0 {
			t.Errorf("%s: %q, want none", k, v)
		}
	}
	if v := hdr.Get("x-ratelimit-limit"); len(v) != 1 || v[0] != "10" {
		t.Errorf("x-ratelimit-limit %q, want 10", v)
	}
	if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("cost 1, Redis down: %v, want Unavailable", err)
	}
}
