package grpclimit

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
)

// A denial's message rounds its wait up as the metadata's retry-after
// does, without wrapping around for the longest waits.
func TestDenialMessageLongWait(t *testing.T) {
	long := time.Duration(1<<63 - 1)
	msg := status.Convert(denial("p", sluice.Decision{Limit: sluice.PerMinute(1), RetryAfter: long})).Message()
	if want := "retry in 9223372037s"; !strings.Contains(msg, want) {
		t.Errorf("message %q, want it to say %q", msg, want)
	}
}
