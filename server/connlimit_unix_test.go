//go:build unix

package server

import (
	"net"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestUnread: unread sees a peer's bytes waiting in the socket until they
// are read, without taking them; a Read in progress does not hold it up.
func TestUnread(t *testing.T) {
	ln := redistest.Listen(t)
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if unread(server) {
		t.Error("unread before the peer sent anything")
	}
	read := make(chan int)
	go func() {
		n, _ := server.Read(make([]byte, 16))
		read <- n
	}()
	time.Sleep(50 * time.Millisecond) // the Read waits
	if unread(server) {
		t.Error("unread with nothing sent, a Read waiting")
	}
	client.Write([]byte("GET"))
	if n := <-read; n != 3 {
		t.Fatalf("read %d bytes", n)
	}
	if unread(server) {
		t.Error("unread after the bytes were read")
	}
	client.Write([]byte("more"))
	for deadline := time.Now().Add(time.Second); !unread(server); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("bytes sent and not read: not unread")
		}
	}
	if !unread(server) {
		t.Error("a peek consumed the bytes")
	}
}
