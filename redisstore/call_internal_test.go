package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"
)

// lateTimer is a context whose deadline has passed but whose timer has not
// fired yet: the moment in which go-redis, with ContextTimeoutEnabled, can
// end a read at the deadline before the context knows it has ended.
type lateTimer struct{ context.Context }

func (lateTimer) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A check or membership call that finishes once the caller's deadline has
// passed is never a success, whether or not the context's timer has fired
// yet.
func TestBoundedNoSuccessPastDeadline(t *testing.T) {
	live, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx := lateTimer{live}
	if err := boundedErr(ctx, func() error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("boundedErr past the deadline = %v, want context.DeadlineExceeded", err)
	}
	// Within the deadline, the send's own result.
	ok, cancelOK := context.WithTimeout(context.Background(), time.Minute)
	defer cancelOK()
	want := errors.New("the send's error")
	if err := boundedErr(ok, func() error { return want }); err != want {
		t.Errorf("boundedErr within the deadline = %v, want the send's error", err)
	}
	if err := boundedErr(ok, func() error { return nil }); err != nil {
		t.Errorf("boundedErr within the deadline = %v, want nil", err)
	}
}
