// Package grpctest serves and dials gRPC on loopback for the tests of the
// gRPC interceptor and the service.
package grpctest

import (
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Serve serves srv on a free loopback port until the test ends, and
// returns a client connection to it.
func Serve(t testing.TB, srv *grpc.Server) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return Dial(t, ln.Addr().String())
}

// Dial returns a plaintext client connection to addr, closed at cleanup.
func Dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
