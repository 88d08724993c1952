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

	"github.com/sluicehq/sluice/internal/grpctest"
)

// A nil *Interceptor (New's error ignored) fails every call, unary and
// stream, with Internal naming the cause: it neither panics nor lets calls
// through unlimited. Over a real server and client.
func TestNilInterceptor(t *testing.T) {
	t.Parallel()
	var in *Interceptor
	srv := grpc.NewServer(grpc.UnaryInterceptor(in.Unary()), grpc.StreamInterceptor(in.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	client := healthpb.NewHealthClient(grpctest.Serve(t, srv))
	ctx := context.Background()
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	checkNilStatus(t, "unary", err)
	stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	checkNilStatus(t, "stream", err)
}

func checkNilStatus(t *testing.T, what string, err error) {
	t.Helper()
	if st, _ := status.FromError(err); st.Code() != codes.Internal || !strings.Contains(st.Message(), "nil *grpclimit.Interceptor") {
		t.Errorf("%s call through a nil Interceptor: %v; want Internal naming it", what, err)
	}
}

// The interceptors refuse nil arguments with Internal rather than
// panicking: grpc never passes them, but a hand-made chain might.
func TestInterceptorNilArguments(t *testing.T) {
	t.Parallel()
	var in Interceptor
	ok := func(context.Context, any) (any, error) { return nil, nil }
	for name, err := range map[string]error{
		"nil info": func() error { _, err := in.Unary()(context.Background(), nil, nil, ok); return err }(),
		"nil handler": func() error {
			_, err := in.Unary()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/a/b"}, nil)
			return err
		}(),
		"nil stream": in.Stream()(nil, nil, &grpc.StreamServerInfo{FullMethod: "/a/b"}, func(any, grpc.ServerStream) error { return nil }),
	} {
		if status.Code(err) != codes.Internal {
			t.Errorf("%s: %v, want Internal", name, err)
		}
	}
}
