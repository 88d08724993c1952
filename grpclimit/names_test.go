package grpclimit

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
)

// unicodeName is a rule name with printable non-ASCII characters and
// quotes: messages quote it as strconv.Quote does, é and α as written.
const unicodeName = `connexion-réseau "α"`

// A rule's name reaches the client's status message as written,
// printable Unicode as is and quotes escaped (strconv.Quote), never as a
// Go escape such as \u00e9, and QuotaFailure's subject is the name
// itself: a rate denial, a call no wait admits, an in-flight refusal and
// a shed call. Over a real listener, from a real client.
func TestNamesInStatusMessages(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, what string, err error, code codes.Code, subject bool) {
		t.Helper()
		st := status.Convert(err)
		if st.Code() != code {
			t.Fatalf("%s: %v, want %v", what, err, code)
		}
		msg := st.Message()
		if want := strconv.Quote(unicodeName); !strings.Contains(msg, want) || strings.Contains(msg, `\u`) {
			t.Errorf("%s: message %q does not name the rule as %s", what, msg, want)
		}
		if !subject {
			return
		}
		for _, d := range st.Details() {
			if q, ok := d.(*errdetails.QuotaFailure); ok {
				if got := q.Violations[0].Subject; got != unicodeName {
					t.Errorf("%s: QuotaFailure subject %q, want %q", what, got, unicodeName)
				}
				return
			}
		}
		t.Errorf("%s: no QuotaFailure", what)
	}
	ctx := context.Background()

	rate := serve(t, slotStore(t), []Rule{{Name: unicodeName, Limit: sluice.PerMinute(1), Key: Global()}}, nil)
	rate.Check(ctx, &healthpb.HealthCheckRequest{})
	_, err := rate.Check(ctx, &healthpb.HealthCheckRequest{})
	check(t, "rate denial", err, codes.ResourceExhausted, true)

	never := serve(t, slotStore(t), []Rule{{Name: unicodeName, Limit: sluice.PerMinute(1), Key: Global(), Cost: func(context.Context, string) int64 { return 2 }}}, nil)
	_, err = never.Check(ctx, &healthpb.HealthCheckRequest{})
	check(t, "never", err, codes.ResourceExhausted, true)

	for _, tt := range []struct {
		what    string
		opts    Options
		code    codes.Code
		subject bool
	}{
		{"in-flight", Options{InFlight: []InFlightRule{{Name: unicodeName, Limit: sluice.Concurrent(1, time.Hour), Key: Global()}}}, codes.ResourceExhausted, true},
		{"shed", Options{Shed: []ShedRule{{Name: unicodeName, Capacity: sluice.Concurrent(1, time.Hour)}}}, codes.Unavailable, false},
		{"workers", Options{Shed: []ShedRule{{Name: unicodeName, Workers: 1}}}, codes.Unavailable, false},
	} {
		g := newGate()
		client := serveHealth(t, slotStore(t), nil, &tt.opts, g)
		done := background(client, ctx)
		<-g.entered
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		check(t, tt.what, err, tt.code, tt.subject)
		close(g.leave)
		<-done
	}
}
