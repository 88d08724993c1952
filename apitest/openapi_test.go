package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	liberrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/server"
)

// Why libopenapi-validator: it is maintained (releases through 2026), it
// checks a document against the OpenAPI 3.1 specification's own schema and
// compiles the document's schemas as JSON Schema 2020-12 (through its fork
// of santhosh-tekuri/jsonschema), and it matches real http.Requests and
// http.Responses to operations, status codes and media types, so the test
// needs no routing of its own.

const config = `
domain: web
policies:
  - name: fw
    limit: fixed_window 3/min
  - name: dry
    limit: 1/min
    strategy: shadow
  - name: jobs
    in_flight: {max: 2, hold: 1m, reserve: {critical: 0.5}}
  - name: hot
    limit: 100/min
    lease: 1s
`

const token = "admin-secret"

// start runs the real service on loopback ports and returns its base URL.
func start(t *testing.T, opts server.Options) string {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	opts.ConfigFile, opts.HTTPAddr, opts.GRPCAddr = cfg, "127.0.0.1:0", "127.0.0.1:0"
	opts.Logger = slog.New(slog.DiscardHandler)
	srv, err := server.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return "http://" + srv.HTTPAddr()
}

type exchange struct {
	name, method, path, body string
	auth                     string // Authorization header
	status                   int
	// valid: the request is one the document allows, and is checked
	// against it too. Requests made to provoke a 4xx are not.
	valid bool
}

func envoyBody(key string) string {
	return `{"domain":"web","descriptors":[{"entries":[{"key":"policy","value":"fw"},{"key":"key","value":"` + key + `"}]}]}`
}

// forged is a well-formed token of the policy jobs, key a, that no acquire
// returned: its holder id is made up.
var forged = "0123456789abcdef0123456789abcdef.am9icw.YQ"

var big = `{"policy":"fw","key":"` + strings.Repeat("x", server.MaxBodyBytes) + `"}`

// healthy are the exchanges with a service on the memory store.
var healthy = []exchange{
	{"index", "GET", "/v1/", "", "", 200, true},
	{"document", "GET", "/v1/openapi.json", "", "", 200, true},
	{"policies", "GET", "/v1/policies", "", "", 200, true},
	{"check allowed", "POST", "/v1/check", `{"policy":"fw","key":"a"}`, "", 200, true},
	{"check allowed with cost", "POST", "/v1/check", `{"policy":"fw","key":"a","cost":2}`, "", 200, true},
	{"check denied", "POST", "/v1/check", `{"policy":"fw","key":"a"}`, "", 429, true},
	{"check shadow", "POST", "/v1/check", `{"policy":"dry","key":"a"}`, "", 200, true},
	{"check shadow denied", "POST", "/v1/check", `{"policy":"dry","key":"a"}`, "", 200, true},
	// A leased policy's key turns hot after a few checks: the last are
	// answered from the lease ("source": "lease").
	{"check leased", "POST", "/v1/check", `{"policy":"hot","key":"h"}`, "", 200, true},
	{"check leased again", "POST", "/v1/check", `{"policy":"hot","key":"h"}`, "", 200, true},
	{"check leased a third time", "POST", "/v1/check", `{"policy":"hot","key":"h"}`, "", 200, true},
	{"check leased, the key hot", "POST", "/v1/check", `{"policy":"hot","key":"h"}`, "", 200, true},
	{"check leased, from the lease", "POST", "/v1/check", `{"policy":"hot","key":"h"}`, "", 200, true},
	{"peek leased", "POST", "/v1/peek", `{"policy":"hot","key":"h"}`, "", 200, true},
	{"check unknown policy", "POST", "/v1/check", `{"policy":"nope","key":"a"}`, "", 404, true},
	{"check cost above capacity", "POST", "/v1/check", `{"policy":"fw","key":"a","cost":9}`, "", 400, true},
	{"check empty key", "POST", "/v1/check", `{"policy":"fw","key":""}`, "", 400, false},
	{"check cost of the wrong type", "POST", "/v1/check", `{"policy":"fw","key":"a","cost":"2"}`, "", 400, false},
	{"check unknown field", "POST", "/v1/check", `{"policy":"fw","key":"a","weight":1}`, "", 400, false},
	{"check not JSON", "POST", "/v1/check", `policy=fw`, "", 400, false},
	{"check too large", "POST", "/v1/check", big, "", 413, false},
	{"check sent as text", "POST", "/v1/check", `{"policy":"fw","key":"a"}`, "", 415, false},
	{"peek", "POST", "/v1/peek", `{"policy":"fw","key":"a"}`, "", 200, true},
	{"peek unknown policy", "POST", "/v1/peek", `{"policy":"nope","key":"a"}`, "", 404, true},
	{"peek no key", "POST", "/v1/peek", `{"policy":"fw"}`, "", 400, false},
	{"peek too large", "POST", "/v1/peek", big, "", 413, false},
	{"peek sent as text", "POST", "/v1/peek", `{"policy":"fw","key":"a"}`, "", 415, false},
	{"reset without token", "POST", "/v1/reset", `{"policy":"fw","key":"a"}`, "", 401, true},
	{"reset wrong token", "POST", "/v1/reset", `{"policy":"fw","key":"a"}`, "Bearer wrong", 403, true},
	{"reset", "POST", "/v1/reset", `{"policy":"fw","key":"a"}`, "Bearer " + token, 204, true},
	{"reset unknown policy", "POST", "/v1/reset", `{"policy":"nope","key":"a"}`, "Bearer " + token, 404, true},
	{"reset empty body", "POST", "/v1/reset", ``, "Bearer " + token, 400, false},
	{"reset too large", "POST", "/v1/reset", big, "Bearer " + token, 413, false},
	{"reset sent as text", "POST", "/v1/reset", `{"policy":"fw","key":"a"}`, "Bearer " + token, 415, false},
	{"stats", "GET", "/v1/stats", "", "", 200, true},
	{"status", "GET", "/v1/status", "", "", 200, true},
	{"top", "GET", "/v1/top", "", "Bearer " + token, 200, true},
	{"top without token", "GET", "/v1/top", "", "", 401, true},
	{"top wrong token", "GET", "/v1/top", "", "Bearer wrong", 403, true},
	{"envoy ok", "POST", "/json", envoyBody("e"), "", 200, true},
	{"envoy ok again", "POST", "/json", envoyBody("e"), "", 200, true},
	{"envoy ok a third time", "POST", "/json", envoyBody("e"), "", 200, true},
	{"envoy over limit", "POST", "/json", envoyBody("e"), "", 429, true},
	{"envoy malformed", "POST", "/json", `{"domain":`, "", 400, false},
	{"envoy empty domain", "POST", "/json", `{"domain":"","descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`, "", 400, false},
	{"envoy too large", "POST", "/json", big, "", 413, false},
	{"envoy sent as text", "POST", "/json", envoyBody("t"), "", 200, false}, // read as JSON, as upstream does
	{"envoy sent compressed", "POST", "/json", envoyBody("t"), "", 415, false},
	{"acquire", "POST", "/v1/acquire", `{"policy":"jobs","key":"a"}`, "", 200, true},
	{"acquire shed", "POST", "/v1/acquire", `{"policy":"jobs","key":"a","priority":"normal"}`, "", 503, true},
	{"acquire weighted", "POST", "/v1/acquire", `{"policy":"jobs","key":"b","weight":2,"priority":"critical"}`, "", 200, true},
	{"acquire denied", "POST", "/v1/acquire", `{"policy":"jobs","key":"b"}`, "", 429, true},
	{"acquire unknown policy", "POST", "/v1/acquire", `{"policy":"nope","key":"a"}`, "", 404, true},
	{"acquire a rate policy", "POST", "/v1/acquire", `{"policy":"fw","key":"a"}`, "", 400, true},
	{"acquire weight zero", "POST", "/v1/acquire", `{"policy":"jobs","key":"a","weight":0}`, "", 400, false},
	{"acquire unknown priority", "POST", "/v1/acquire", `{"policy":"jobs","key":"a","priority":"vip"}`, "", 400, false},
	{"acquire too large", "POST", "/v1/acquire", big, "", 413, false},
	{"acquire sent as text", "POST", "/v1/acquire", `{"policy":"jobs","key":"a"}`, "", 415, false},
	{"extend", "POST", "/v1/extend", `{"token":"{token}"}`, "", 200, true},
	{"release", "POST", "/v1/release", `{"token":"{token}"}`, "", 204, true},
	{"release again", "POST", "/v1/release", `{"token":"{token}"}`, "", 204, true},
	{"extend released", "POST", "/v1/extend", `{"token":"{token}"}`, "", 404, true},
	{"release forged", "POST", "/v1/release", `{"token":"` + forged + `"}`, "", 404, true},
	{"release malformed", "POST", "/v1/release", `{"token":"abc"}`, "", 400, true},
	{"extend malformed", "POST", "/v1/extend", `{"token":"abc"}`, "", 400, true},
	{"release too large", "POST", "/v1/release", big, "", 413, false},
	{"extend too large", "POST", "/v1/extend", big, "", 413, false},
	{"release sent as text", "POST", "/v1/release", `{"token":"abc"}`, "", 415, false},
	{"extend sent as text", "POST", "/v1/extend", `{"token":"abc"}`, "", 415, false},
	{"healthz", "GET", "/healthz", "", "", 200, true},
	{"readyz", "GET", "/readyz", "", "", 200, true},
	{"metrics", "GET", "/metrics", "", "", 200, true},
}

// down are the exchanges with a service whose Redis does not answer and
// that has no failure policy.
var down = []exchange{
	{"check, store down", "POST", "/v1/check", `{"policy":"fw","key":"a"}`, "", 503, true},
	{"peek, store down", "POST", "/v1/peek", `{"policy":"fw","key":"a"}`, "", 503, true},
	{"reset, store down", "POST", "/v1/reset", `{"policy":"fw","key":"a"}`, "", 503, true},
	{"envoy, store down", "POST", "/json", envoyBody("e"), "", 503, true},
	{"acquire, store down", "POST", "/v1/acquire", `{"policy":"jobs","key":"a"}`, "", 503, true},
	{"extend, store down", "POST", "/v1/extend", `{"token":"` + forged + `"}`, "", 503, true},
	{"release, store down", "POST", "/v1/release", `{"token":"` + forged + `"}`, "", 503, true},
	{"readyz, store down", "GET", "/readyz", "", "", 503, true},
	{"status, store down", "GET", "/v1/status", "", "", 200, true},
}

// noSlots are the exchanges with a service whose store keeps no in-flight
// slots.
var noSlots = []exchange{
	{"acquire, no slots", "POST", "/v1/acquire", `{"policy":"jobs","key":"a"}`, "", 501, true},
	{"extend, no slots", "POST", "/v1/extend", `{"token":"` + forged + `"}`, "", 501, true},
	{"release, no slots", "POST", "/v1/release", `{"token":"` + forged + `"}`, "", 501, true},
}

// slowBodies are the exchanges with a service of a short read timeout:
// every endpoint that reads a body answers a body still arriving with 408.
var slowBodies = func() []exchange {
	var list []exchange
	for _, e := range []struct{ path, body string }{
		{"/v1/check", `{"policy":"fw","key":"a"}`},
		{"/v1/peek", `{"policy":"fw","key":"a"}`},
		{"/v1/reset", `{"policy":"fw","key":"a"}`},
		{"/v1/acquire", `{"policy":"jobs","key":"a"}`},
		{"/v1/extend", `{"token":"` + forged + `"}`},
		{"/v1/release", `{"token":"` + forged + `"}`},
		{"/json", envoyBody("s")},
	} {
		list = append(list, exchange{e.path + " body too slow", "POST", e.path, e.body, "Bearer " + token, 408, true})
	}
	return list
}()

// rateOnly is a store without in-flight slots.
type rateOnly struct{ sluice.Store }

// undocumented are answers on no documented operation: problems all the same.
var undocumented = []exchange{
	{"wrong method", "GET", "/v1/check", "", "", 405, false},
	{"wrong method on the index", "DELETE", "/v1/", "", "", 405, false},
	{"wrong method on /json", "GET", "/json", "", "", 405, false},
	{"wrong method on /healthz", "POST", "/healthz", "", "", 405, false},
	{"wrong method on /readyz", "DELETE", "/readyz", "", "", 405, false},
	{"wrong method on /metrics", "PUT", "/metrics", "", "", 405, false},
	{"unknown endpoint", "GET", "/v1/nothing", "", "", 404, false},
}

// guarded are the exchanges with a service that has a decision token:
// every decision endpoint asks for it.
var guarded = func() []exchange {
	var list []exchange
	for _, e := range []struct{ path, body string }{
		{"/v1/check", `{"policy":"fw","key":"a"}`},
		{"/v1/peek", `{"policy":"fw","key":"a"}`},
		{"/v1/acquire", `{"policy":"jobs","key":"a"}`},
		{"/v1/extend", `{"token":"` + forged + `"}`},
		{"/v1/release", `{"token":"` + forged + `"}`},
		{"/json", envoyBody("g")},
	} {
		list = append(list,
			exchange{e.path + " without the decision token", "POST", e.path, e.body, "", 401, true},
			exchange{e.path + " with a wrong token", "POST", e.path, e.body, "Bearer wrong", 403, true})
	}
	return list
}()

func loadDocument(t *testing.T) (validator.Validator, *v3.Document) {
	t.Helper()
	doc, err := libopenapi.NewDocument(server.OpenAPIDocument)
	if err != nil {
		t.Fatal(err)
	}
	if v := doc.GetVersion(); v != "3.1.0" {
		t.Fatalf("document is OpenAPI %s, want 3.1.0", v)
	}
	model, err := doc.BuildV3Model()
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return v, &model.Model
}

// The document is valid OpenAPI 3.1.
func TestDocument(t *testing.T) {
	v, _ := loadDocument(t)
	if ok, errs := v.ValidateDocument(); !ok {
		for _, e := range errs {
			t.Errorf("%s: %s", e.Message, e.Reason)
			for _, s := range e.SchemaValidationErrors {
				t.Errorf("  %s: %s", s.FieldPath+" "+s.KeywordLocation, s.Reason)
			}
		}
	}
}

// Every exchange's request (when meant to be valid) and response match the
// document, every documented operation and status is seen, and no problem
// detail speaks of Go.
func TestExchanges(t *testing.T) {
	v, model := loadDocument(t)
	problemSchema := model.Components.Schemas.GetOrZero("Problem").Schema()
	seen := map[string]bool{}
	run := func(t *testing.T, base string, list []exchange, documented bool) {
		token := "" // the last acquire's, for the exchanges that send {token}
		for _, x := range list {
			x.body = strings.ReplaceAll(x.body, "{token}", token)
			req, resp, body := send(t, base, x)
			if x.path == "/v1/acquire" && resp.StatusCode == http.StatusOK && token == "" {
				var a struct{ Token string }
				json.Unmarshal(body, &a)
				token = a.Token
			}
			if resp.StatusCode != x.status {
				t.Errorf("%s: status %d, want %d: %s", x.name, resp.StatusCode, x.status, body)
				continue
			}
			// Every error is a problem; a denial (429, or an acquire's 503
			// when shed) is a decision.
			isProblem := x.status >= 400 && x.status != http.StatusTooManyRequests && !strings.HasSuffix(x.name, " shed")
			if ct := resp.Header.Get("Content-Type"); isProblem && ct != "application/problem+json" {
				t.Errorf("%s: Content-Type %q, want application/problem+json", x.name, ct)
			}
			// A store that did not decide says when to try again.
			if isProblem && x.status == http.StatusServiceUnavailable && x.path != "/readyz" && resp.Header.Get("Retry-After") != "1" {
				t.Errorf("%s: Retry-After %q, want 1", x.name, resp.Header.Get("Retry-After"))
			}
			if isProblem {
				var p struct{ Detail string }
				json.Unmarshal(body, &p)
				if leak := goInternals(p.Detail); leak != "" {
					t.Errorf("%s: detail %q speaks of %q", x.name, p.Detail, leak)
				}
			}
			if !documented {
				if ok, errs := schema_validation.NewSchemaValidator().ValidateSchemaBytes(problemSchema, body); !ok {
					t.Errorf("%s: not a Problem: %s", x.name, describe(errs))
				}
				continue
			}
			if x.valid {
				if ok, errs := v.ValidateHttpRequestSync(req); !ok {
					t.Errorf("%s: request does not match the document: %s", x.name, describe(errs))
				}
			}
			if ok, errs := v.ValidateHttpResponse(req, resp); !ok {
				t.Errorf("%s: %d response does not match the document: %s\n%s", x.name, resp.StatusCode, describe(errs), truncate(body))
			}
			seen[fmt.Sprintf("%s %s %d", x.method, x.path, x.status)] = true
		}
	}
	run(t, start(t, server.Options{AdminToken: token}), healthy, true)
	run(t, start(t, server.Options{DecisionToken: "decide-secret"}), guarded, true)
	run(t, start(t, server.Options{
		RedisURL: "redis://127.0.0.1:1/0?dial_timeout=100ms&max_retries=-1", NoFailurePolicy: true,
		DecisionTimeout: 200 * time.Millisecond, WatchInterval: -1,
	}), down, true)
	mem := memory.New(nil)
	t.Cleanup(func() { mem.Close() })
	run(t, start(t, server.Options{Store: rateOnly{mem}}), noSlots, true)
	run(t, start(t, server.Options{AdminToken: token, ReadTimeout: 300 * time.Millisecond}), slowBodies, true)
	run(t, start(t, server.Options{}), undocumented, false)

	// Every documented operation and status was exercised.
	var missing []string
	for path, item := range model.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			for code := range op.Responses.Codes.KeysFromOldest() {
				k := strings.ToUpper(method) + " " + path + " " + code
				if !seen[k] {
					missing = append(missing, k)
				}
			}
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("documented but never exercised:\n%s", strings.Join(missing, "\n"))
	}
}

// The validator does check: a request with an unknown field, or a response
// missing a required field, fails.
func TestValidatorRejects(t *testing.T) {
	v, _ := loadDocument(t)
	req, _ := http.NewRequest("POST", "http://x/v1/check", strings.NewReader(`{"policy":"fw","key":"a","weight":1}`))
	req.Header.Set("Content-Type", "application/json")
	if ok, _ := v.ValidateHttpRequestSync(req); ok {
		t.Error("a request with an unknown field passed")
	}
	req, _ = http.NewRequest("GET", "http://x/v1/policies", nil)
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(`{"policies":[{"name":"fw"}]}`))}
	if ok, _ := v.ValidateHttpResponse(req, resp); ok {
		t.Error("a policy without its algorithm passed")
	}
}

// send makes one exchange and returns the request (its body readable again),
// the response (likewise) and the response body.
func send(t *testing.T, base string, x exchange) (*http.Request, *http.Response, []byte) {
	t.Helper()
	mk := func() *http.Request {
		req, err := http.NewRequest(x.method, base+x.path, strings.NewReader(x.body))
		if err != nil {
			t.Fatal(err)
		}
		if x.method == http.MethodPost {
			ct := "application/json"
			switch {
			case x.status != http.StatusUnsupportedMediaType:
			case x.path == "/json": // what provokes it there: /json reads any type
				req.Header.Set("Content-Encoding", "gzip")
			default: // what provokes it
				ct = "text/plain"
			}
			req.Header.Set("Content-Type", ct)
		}
		if x.auth != "" {
			req.Header.Set("Authorization", x.auth)
		}
		return req
	}
	first := mk()
	if x.status == http.StatusRequestTimeout { // what provokes it: half the body, the rest after the response
		rest := make(chan struct{})
		defer close(rest)
		half := len(x.body) / 2
		first.Body = io.NopCloser(io.MultiReader(strings.NewReader(x.body[:half]), blocked{rest}, strings.NewReader(x.body[half:])))
		first.ContentLength = int64(len(x.body))
	}
	resp, err := http.DefaultClient.Do(first)
	if err != nil {
		t.Fatalf("%s: %v", x.name, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("%s: %v", x.name, err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return mk(), resp, body
}

// blocked reads nothing until its channel closes, then ends.
type blocked struct{ c chan struct{} }

func (b blocked) Read([]byte) (int, error) {
	<-b.c
	return 0, io.EOF
}

func describe(errs []*liberrors.ValidationError) string {
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "\n  %s: %s", e.Message, e.Reason)
		for _, s := range e.SchemaValidationErrors {
			fmt.Fprintf(&b, "\n    %s: %s", s.FieldPath+" "+s.KeywordLocation, s.Reason)
		}
	}
	return b.String()
}

func truncate(b []byte) string {
	if len(b) > 600 {
		return string(b[:600]) + "…"
	}
	return string(b)
}

// goInternals returns the first Go package prefix or type wording found in
// a problem detail, or "".
func goInternals(detail string) string {
	leaks := []string{"server:", "sluice:", "json:", "proto:", "http:", "Go struct", "int64", "Request.", "<nil>"}
	if i := slices.IndexFunc(leaks, func(w string) bool { return strings.Contains(detail, w) }); i >= 0 {
		return leaks[i]
	}
	return ""
}

// The states a single service cannot reach here (a Cluster master's
// breaker open, a master failing the checks) still match the document:
// /v1/status and /v1/stats's store with every optional list set.
func TestClusterFieldsDocumented(t *testing.T) {
	_, model := loadDocument(t)
	masters := []string{"10.0.0.2:6379"}
	for name, v := range map[string]any{
		"Status": server.Status{
			Ready: true, Degraded: true, Reasons: []string{"a master"}, FailurePolicy: "local",
			OpenPartitions: masters, FailingMasters: masters,
			Store: server.StoreStatus{Kind: "redis", Up: true, Since: time.Now()}, Admin: "token",
			Config: &server.ConfigStatus{Version: 1, LoadedAt: time.Now()},
		},
		"StoreHealth": server.StoreHealth{Store: "redis", Mode: "cluster", Breaker: "open", OpenPartitions: masters},
	} {
		body, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		schema := model.Components.Schemas.GetOrZero(name).Schema()
		if ok, errs := schema_validation.NewSchemaValidator().ValidateSchemaBytes(schema, body); !ok {
			t.Errorf("%s %s does not match the document: %s", name, body, describe(errs))
		}
	}
}

// A rejected reload's config object in /v1/status matches the document, and
// the next good reload's does too.
func TestRejectedReloadDocumented(t *testing.T) {
	v, _ := loadDocument(t)
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(config)
	srv, err := server.New(server.Options{ConfigFile: file, HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		WatchInterval: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	base := "http://" + srv.HTTPAddr()
	status := func(t *testing.T, want string) {
		t.Helper()
		req, resp, body := send(t, base, exchange{name: "status", method: "GET", path: "/v1/status", status: 200, valid: true})
		if ok, errs := v.ValidateHttpResponse(req, resp); !ok {
			t.Errorf("%d response does not match the document: %s\n%s", resp.StatusCode, describe(errs), truncate(body))
		}
		if !strings.Contains(string(body), want) {
			t.Errorf("status %s lacks %s", body, want)
		}
	}
	for _, bad := range []string{
		"policies:\n  - name: a\n    limit: 5/fortnight\n  - name: b\n    limit: x\n", // two positioned problems
		"policies: []\n", // a problem of the file as a whole
	} {
		write(bad)
		if err := srv.Reload(); err == nil {
			t.Fatalf("%q reloaded", bad)
		}
		status(t, `"rejected":`)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err == nil {
		t.Fatal("a missing file reloaded")
	}
	status(t, `"rejected":`)
	write(config)
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	status(t, `"config":{"version":2,`)
}
