package grpclimit

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/middlewaretest"
)

// A nil *Interceptor (New's error ignored) fails every call, unary and
// stream, with Internal naming the cause: it neither panics nor lets calls
// through unlimited. Over a real server and client.
func TestNilInterceptor(t *testing.T) {
	t.Parallel()
	var in *Interceptor
	client := healthOn(t, grpc.NewServer(grpc.UnaryInterceptor(in.Unary()), grpc.StreamInterceptor(in.Stream())), health.NewServer())
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

// A nil context (or a stream whose Context is nil) is refused with
// Internal too: keying the call on its metadata, or handing the handler
// nil, panicked.
func TestInterceptorNilContext(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	in, err := New(store, []Rule{
		{Name: "per-key", Limit: sluice.PerSecond(5), Key: Metadata("x-api-key")},
		{Name: "global", Limit: sluice.PerSecond(1), Key: Global(), Strategy: Delay, MaxDelay: time.Second},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var nilCtx context.Context
	ok := func(context.Context, any) (any, error) { return nil, nil }
	for i := range 2 { // the second would be delayed
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("unary call %d with a nil context panicked: %v", i, p)
				}
			}()
			_, err := in.Unary()(nilCtx, nil, &grpc.UnaryServerInfo{FullMethod: "/a/b"}, ok)
			if status.Code(err) != codes.Internal {
				t.Errorf("unary call %d with a nil context: %v, want Internal", i, err)
			}
		}()
	}
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("stream with a nil context panicked: %v", p)
			}
		}()
		err := in.Stream()(nil, nilContextStream{}, &grpc.StreamServerInfo{FullMethod: "/a/b"}, func(any, grpc.ServerStream) error { return nil })
		if status.Code(err) != codes.Internal {
			t.Errorf("stream with a nil context: %v, want Internal", err)
		}
	}()
}

// nilContextStream is a hand-made stream whose Context is nil; nothing
// else of it may be called.
type nilContextStream struct{ grpc.ServerStream }

func (nilContextStream) Context() context.Context { return nil }

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
	var logs logtest.Log
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
	client := healthOn(t, grpc.NewServer(grpc.ChainUnaryInterceptor(auth, in.Unary())), health.NewServer())
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
