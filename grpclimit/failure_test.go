package grpclimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/promsluice"
	"github.com/sluicehq/sluice/storetest"
)

// A call whose own context has ended (the client canceled, or its
// deadline passed) was not failed by the store: its status is the
// context's, and no error decision is counted.
func TestEndedContextIsNoStoreFailure(t *testing.T) {
	store := memory.New(nil)
	defer store.Close()
	c := promsluice.New(nil)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	in, err := grpclimit.New(store, []grpclimit.Rule{{Name: "rate", Limit: sluice.PerHour(100), Key: grpclimit.Global()}}, &grpclimit.Options{
		Observer: c,
		InFlight: []grpclimit.InFlightRule{{Name: "inflight", Limit: sluice.Concurrent(5, time.Minute), Key: grpclimit.Global()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	inRate, err := grpclimit.New(store, []grpclimit.Rule{{Name: "rate2", Limit: sluice.PerHour(100), Key: grpclimit.Global()}}, &grpclimit.Options{Observer: c})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	info := &grpc.UnaryServerInfo{FullMethod: "/svc/M"}
	ok := func(context.Context, any) (any, error) { return "ok", nil }
	_, err1 := in.Unary()(ctx, nil, info, ok)
	_, err2 := inRate.Unary()(ctx, nil, info, ok)
	e1, _ := promtest.Value(t, reg, "sluice_inflight_acquires_total", map[string]string{"policy": "inflight", "outcome": "error"})
	e2, _ := promtest.Value(t, reg, "sluice_decisions_total", map[string]string{"policy": "rate2", "outcome": "error"})
	if status.Code(err1) != codes.DeadlineExceeded || status.Code(err2) != codes.DeadlineExceeded || e1 != 0 || e2 != 0 {
		t.Errorf("an ended call context is reported as a store failure: codes %v/%v, error metrics %v/%v", status.Code(err1), status.Code(err2), e1, e2)
	}
}

// A store that fails is Unavailable with a RetryInfo of a second, as
// httplimit's 503 carries Retry-After: 1.
func TestStoreDownRetryInfo(t *testing.T) {
	in, err := grpclimit.New(storetest.Down{}, []grpclimit.Rule{{Name: "rate", Limit: sluice.PerHour(100), Key: grpclimit.Global()}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = in.Unary()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/svc/M"}, func(context.Context, any) (any, error) { return "ok", nil })
	st := status.Convert(err)
	var retry time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retry = ri.RetryDelay.AsDuration()
		}
	}
	if st.Code() != codes.Unavailable || retry != time.Second {
		t.Errorf("store down: %v, retry %v; want Unavailable, RetryInfo 1s", st, retry)
	}
}
