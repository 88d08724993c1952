package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/memory"
)

const fuzzConfig = `
domain: edge
descriptors:
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: "/api*"
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 3}
policies:
  - name: api
    limit: 5/min
    key: "{user}"
  - name: login
    limit: token_bucket 3/s burst 5
    cost: 2
  - name: exports
    key: "{user}"
    in_flight: {max: 3, hold: 10s}
`

var fuzzPaths = []string{"/v1/check", "/v1/peek", "/v1/reset", "/v1/acquire", "/v1/extend", "/v1/release", "/json"}

// FuzzJSONAPI sends request bodies to the JSON API's decision and admin
// calls through the real handler on a memory store: every answer is a
// decision (200, 204, 429) or a 4xx problem, never a 5xx nor a panic, and
// a refused request changes no counter.
func FuzzJSONAPI(f *testing.F) {
	for _, b := range []string{
		`{"policy":"api","key":"bob"}`, `{"policy":"api","key":"bob","cost":3}`, `{"policy":"api","key":"bob","cost":0}`,
		`{"policy":"api","key":"bob","cost":-1}`, `{"policy":"api","key":"bob","cost":9223372036854775807}`,
		`{"policy":"login","key":"x","cost":6}`, `{"policy":"nope","key":"bob"}`, `{"policy":"api","key":""}`,
		`{"policy":"api","key":"{x}"}`, `{"policy":"api","key":"50%off"}`, `{"policy":"api","key":"%41"}`,
		`{"policy":"api","key":"bob","KEY":"victim"}`, `{"policy":"api","key":"a","key":"b"}`, `{"policy":"api","key":null}`,
		`null`, `[]`, `{}`, `{"policy":"api","key":"bob"} {}`, `{"policy":"api","key":"\ud800"}`,
		`{"policy":"exports","key":"bob"}`, `{"policy":"exports","key":"bob","weight":2,"priority":"normal"}`,
		`{"policy":"exports","key":"bob","weight":0}`, `{"policy":"exports","key":"bob","priority":"urgent"}`,
		`{"token":"x"}`, `{"token":""}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"route","value":"a"}]}]}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"path","value":"/api/x"}],"hits_addend":4294967296}]}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"bob"}]}],"hits_addend":7}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"route","value":"a"}],"limit":{"requests_per_unit":2,"unit":"HOUR"}}]}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"route","value":"a"}],"limit":{"requests_per_unit":2,"unit":"UNKNOWN"}}]}`,
		`{"domain":"","descriptors":[]}`, `{"domain":"edge","descriptors":[{"entries":[{"key":"route","value":"a"}],"hitsAddend":"x"}]}`,
		// Field names in another case, numbers of other shapes, a BOM,
		// text cut short, unknown fields.
		`{"Policy":"api","Key":"bob","COST":2}`, `{"policy":"api","key":"bob","cost":1.5}`, `{"policy":"api","key":"bob","cost":1e3}`,
		`{"policy":"api","key":"bob","cost":"1"}`, `{"policy":"api","key":"bob","colour":1}`, "\ufeff{\"policy\":\"api\",\"key\":\"bob\"}",
		`{"policy":"api","key":"bob"`, `{"policy":"api","key":"b\u0000b"}`, `{"policy":"login","key":"x","cost":5}`,
		`{"policy":"exports","key":"bob","weight":9223372036854775807}`, `{"policy":"exports","key":"bob","priority":"critical"}`,
		`{"token":"AAAAAAAAAAAAAAAAAAAAAA=="}`, `{"token":"x","policy":"api"}`,
		`{"domain":"edge","descriptors":[{"entries":[]}]}`, `{"domain":"edge","descriptors":[null]}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"route","value":"a"}],"is_negative_hits":true,"hits_addend":3}]}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"route","value":"a"}],"hitsAddend":"18446744073709551615"}]}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"route","value":"a"}],"limit":{"requests_per_unit":4294967295,"unit":"YEAR","unit_multiplier":4294967295}}]}`,
		`{"domain":"edge","hits_addend":4294967295,"descriptors":[{"entries":[{"key":"route","value":"a"}]}],"colour":1}`,
	} {
		for i := range fuzzPaths {
			f.Add(uint8(i), []byte(b))
		}
	}
	var (
		svc   *Service
		h     http.Handler
		clock *fakeClock
	)
	f.Fuzz(func(t *testing.T, path uint8, body []byte) {
		// One service for all the inputs a process runs: building one
		// each time cost most of a run. Each input resets the counters it
		// checks, and starts a minute on (holds expire, windows move).
		if svc == nil {
			clock = newFakeClock()
			store := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: time.Second})
			svc = NewService(store, mustConfig(t, fuzzConfig), &ServiceOptions{Clock: clock.Now})
			h = svc.Handler(nil)
		}
		clock.Advance(time.Minute)
		target := fuzzPaths[int(path)%len(fuzzPaths)]
		// The counters the body may name: its key under each rate policy,
		// decoded as the handler does (field names match in any case).
		keys := []string{"bob", "x"}
		var named struct{ Key *string }
		_ = json.NewDecoder(bytes.NewReader(body)).Decode(&named)
		if named.Key != nil {
			keys = append(keys, *named.Key)
		}
		peek := func() []int64 {
			var out []int64
			for _, p := range []string{"api", "login"} {
				for _, k := range keys {
					res, err := svc.Peek(context.Background(), p, k, 0)
					if err != nil {
						out = append(out, -1)
						continue
					}
					out = append(out, res.Decision.Remaining)
				}
			}
			return out
		}
		for _, p := range []string{"api", "login"} {
			for _, k := range keys {
				_ = svc.Reset(context.Background(), p, k)
			}
		}
		// Take a little first, so that a reset that should not have
		// happened shows.
		for _, k := range keys {
			svc.Check(context.Background(), "api", k, 1)
		}
		before := peek()
		req := httptest.NewRequest(http.MethodPost, target, strings.NewReader(string(body)))
		req.RemoteAddr = "127.0.0.1:5000" // reset answers loopback clients
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		code := rec.Code
		switch {
		case code == http.StatusOK, code == http.StatusNoContent, code == http.StatusTooManyRequests:
			return
		case code >= 400 && code < 500:
			if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("POST %s %q: %d with Content-Type %q: %s", target, body, code, ct, rec.Body)
			}
		default:
			t.Fatalf("POST %s %q: %d: %s", target, body, code, rec.Body)
		}
		if after := peek(); !slices.Equal(before, after) {
			t.Fatalf("POST %s %q refused (%d: %s), and counters went from %v to %v", target, body, code, rec.Body, before, after)
		}
	})
}

// FuzzRLS calls the RLS handler directly (no network) with descriptors
// of odd entries, any hits_addend and limit overrides of every unit: it
// answers or refuses with InvalidArgument, never another code nor a
// panic.
func FuzzRLS(f *testing.F) {
	f.Add("edge", "route", "a", "", "", uint64(1), false, uint32(0), false, int32(0), uint32(0), uint32(0))
	f.Add("edge", "path", "/api/x", "user", "bob", uint64(1<<63), true, uint32(7), false, int32(2), uint32(5), uint32(3))
	f.Add("edge", "route", "a", "", "", uint64(0), true, uint32(1<<31), true, int32(9), uint32(1<<32-1), uint32(1<<32-1))
	f.Add("edge", "policy", "api", "user", "{x}%", uint64(6), true, uint32(0), false, int32(4), uint32(0), uint32(0))
	f.Add("other", "", "", "", "", uint64(1), false, uint32(0), false, int32(-1), uint32(1), uint32(0))
	f.Add("", "route", "a", "", "", uint64(1), false, uint32(0), false, int32(0), uint32(0), uint32(0))
	// Units past SECOND..WEEK and the longest windows multiplied, keys
	// and values that are empty, control bytes or escapes.
	f.Add("edge", "route", "a", "", "", uint64(1), false, uint32(0), false, int32(6), uint32(1), uint32(1<<32-1))
	f.Add("edge", "route", "a", "", "", uint64(1), false, uint32(0), false, int32(1<<31-1), uint32(1), uint32(0))
	f.Add("edge", "route", "", "", "x", uint64(1), false, uint32(0), false, int32(7), uint32(0), uint32(2))
	f.Add("edge\x00", "route\x00", "%7B", "path", "/api%", uint64(3), true, uint32(0), true, int32(0), uint32(0), uint32(0))
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2 string, hits uint64, setHits bool, reqHits uint32, negative bool, unit int32, rpu, mult uint32) {
		svc := newMemService(t, fuzzConfig, newFakeClock())
		d := desc(k1 + "=" + v1)
		d.Entries[0].Key, d.Entries[0].Value = k1, v1
		if k2 != "" || v2 != "" {
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k2, Value: v2})
		}
		if setHits {
			d.HitsAddend = wrapperspb.UInt64(hits)
		}
		d.IsNegativeHits = negative
		if unit != 0 {
			d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit(unit)}
			if mult != 0 {
				d.Limit.UnitMultiplier = wrapperspb.UInt32(mult)
			}
		}
		req := rlsRequest(domain, d, desc("route=b"))
		req.HitsAddend = reqHits
		_, err := rlsServer{svc: svc}.ShouldRateLimit(context.Background(), req)
		if err != nil && status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%v: %v", req, err)
		}
	})
}
