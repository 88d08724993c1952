package redisstore

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
)

// The version rule, as a table: only redis-server 7.0 and later are
// installed to test against, so an older server's refusal is proved here
// on its INFO value.
func TestVersionAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want bool
	}{
		{"7.0.0", true}, {"7.0.15", true}, {"7.2.4", true}, {"8.0.0", true}, {"10.0", true},
		{"6.2.14", false}, {"6.0", false}, {"5.0.7", false}, {"", false}, {"x.y", false}, {"7", true},
	} {
		if got := versionAtLeast(tc.v, MinVersion); got != tc.want {
			t.Errorf("versionAtLeast(%q, %q) = %v, want %v", tc.v, MinVersion, got, tc.want)
		}
	}
}

// Unanswered: a timeout from a server known to accept connections is a
// stall named as such; a refusal stays unreachable, and a stall Check
// already named keeps its words.
func TestUnanswered(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, tc := range []struct {
		name string
		err  error
		kind error
		hint string
	}{
		{"deadline", context.DeadlineExceeded, ErrStalled, unansweredHint},
		{"classified deadline", Classify(context.DeadlineExceeded), ErrStalled, unansweredHint},
		{"refused", refused, ErrUnreachable, "retrying"},
		{"check's stall", checkErr(ErrStalled, shutdownHint, context.DeadlineExceeded), ErrStalled, shutdownHint},
		{"auth", errors.New("WRONGPASS invalid username-password pair"), ErrAuth, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ce *CheckError
			if err := Unanswered(tc.err); !errors.As(err, &ce) || ce.Kind != tc.kind || (tc.hint != "" && ce.Hint != tc.hint) {
				t.Errorf("Unanswered(%v) = %v, want kind %v, hint %q", tc.err, err, tc.kind, tc.hint)
			}
		})
	}
	if Unanswered(nil) != nil {
		t.Error("Unanswered(nil) is not nil")
	}
}

// A stall Unanswered named is named as the shutdown a check found, as
// Stalled's is: a call cannot tell one from the other.
func TestUnansweredOnShutdown(t *testing.T) {
	if err := StalledOnShutdown(Unanswered(context.DeadlineExceeded)); !ShuttingDown(err) {
		t.Errorf("StalledOnShutdown(Unanswered(timeout)) = %v, want the shutdown named", err)
	}
}
