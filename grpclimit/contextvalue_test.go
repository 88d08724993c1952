package grpclimit

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/middlewaretest"
)

type cvUser struct{ id string }

func (u *cvUser) String() string { return u.id }

type cvPanicky struct{}

func (cvPanicky) String() string { panic("boom") }

type cvKey struct{}

// An auth interceptor storing a nil *user for an anonymous caller: the
// per-user rule does not apply (ErrNoKey) and the per-IP rule limits the
// call; a panicking String method is Internal, logged. Without a recovery
// interceptor either one used to kill the server process. Over a real
// server and client.
func TestContextValueTypedNil(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	var logs middlewaretest.Log
	in, err := New(store, []Rule{
		{Name: "per-user", Limit: sluice.PerMinute(1), Key: ContextValue(cvKey{})},
		{Name: "per-ip", Limit: sluice.PerMinute(2), Key: PeerIP()},
	}, &Options{Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	var value any = (*cvUser)(nil)
	auth := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(context.WithValue(ctx, cvKey{}, value), req)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, in.Unary()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	client := healthpb.NewHealthClient(grpctest.Serve(t, srv))
	ctx := context.Background()
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		if status.Code(err) != want {
			t.Errorf("call %d with a nil *user: %v, want %v", i, err, want)
		}
		if st, _ := status.FromError(err); want == codes.ResourceExhausted && !strings.Contains(st.Message(), "per-ip") {
			t.Errorf("call %d: %q, want the per-ip rule named", i, st.Message())
		}
	}
	value = cvPanicky{} // no call in flight: the handler reads it after this write
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Internal {
		t.Errorf("a panicking String method: %v, want Internal", err)
	}
	if l := logs.Records(t); len(l) != 1 || !strings.Contains(l[0]["error"].(string), "panicked") {
		t.Errorf("log %v, want one line saying the String method panicked", l)
	}
}
