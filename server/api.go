package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/internal/header"
	probjson "github.com/sluicehq/sluice/internal/problem"
	"github.com/sluicehq/sluice/server/dashboard"
)

// MaxBodyBytes bounds JSON request bodies.
const MaxBodyBytes = 64 << 10

// HandlerOptions configures the HTTP handler. A nil *HandlerOptions is valid.
type HandlerOptions struct {
	// AdminToken, when set, is the bearer token admin endpoints (reset)
	// require. When empty, admin endpoints answer loopback clients only.
	AdminToken string
	// AdminDisabled turns admin endpoints off (403) when AdminToken is
	// empty. Default false; the Server sets it when it listens beyond
	// loopback without a token.
	AdminDisabled bool
	// InsecureAdmin, without AdminToken, says the loopback rule is kept
	// although other hosts reach the port (--insecure-admin): /v1/status
	// then reports admin "insecure". Default false.
	InsecureAdmin bool
	// DecisionToken, when set, is the bearer token the decision endpoints
	// (/v1/check, /v1/peek, /json and the in-flight /v1/acquire,
	// /v1/extend, /v1/release) require; the admin token is accepted too.
	// Default: none, anyone who reaches the port may ask.
	DecisionToken string
	// Health answers /readyz and /v1/status. Default: built from Ready.
	Health *Health
	// Ready, without Health, reports whether the store is reachable:
	// /readyz is 503 while it fails. Default: always ready.
	Ready func(context.Context) error
	// Metrics is served at /metrics when set.
	Metrics *Metrics
	// Dashboard is served at "/" and every path the API does not take.
	// Default: a placeholder page. The placeholder's and the built-in
	// dashboard's (server/dashboard) page paths (/, /index.html,
	// /static/...) take GET and HEAD alone, any other path is 404, both as
	// problems. Any other handler answers every request it is sent itself,
	// whatever the method, its 404s and 405s included, unchanged; its
	// writer supports Flush (http.Flusher, http.ResponseController).
	Dashboard http.Handler
}

// newHandler is Service.Handler.
func newHandler(s *Service, opts *HandlerOptions) http.Handler {
	var o HandlerOptions
	if opts != nil {
		o = *opts
	}
	a := &api{svc: s, token: o.AdminToken, decisionToken: o.DecisionToken, health: o.Health, adminMode: AdminLoopback}
	switch {
	case o.AdminToken != "":
		a.adminMode = AdminToken
	case o.AdminDisabled:
		a.adminMode = AdminDisabled
	case o.InsecureAdmin:
		a.adminMode = AdminInsecure
	}
	if a.health == nil && o.Ready != nil {
		a.health = newHealth(healthOptions{policy: "error", store: "custom", probe: o.Ready})
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/policies", a.policies)
	mux.HandleFunc("POST /v1/check", jsonOnly(a.check))
	mux.HandleFunc("POST /v1/peek", jsonOnly(a.check))
	mux.HandleFunc("POST /v1/reset", jsonOnly(a.reset))
	mux.HandleFunc("POST /v1/acquire", jsonOnly(a.acquire))
	mux.HandleFunc("POST /v1/extend", jsonOnly(a.extend))
	mux.HandleFunc("POST /v1/release", jsonOnly(a.release))
	mux.HandleFunc("GET /v1/stats", a.stats)
	mux.HandleFunc("GET /v1/status", a.status)
	mux.HandleFunc("GET /v1/top", a.top)
	mux.HandleFunc("GET /v1/{$}", a.index)
	mux.HandleFunc("GET /v1/openapi.json", a.openapi)
	// As envoyproxy/ratelimit's: the body is JSON whatever its declared
	// type (its documented call is curl --data, a form's type).
	mux.HandleFunc("POST /json", a.envoyJSON)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", a.readyz)
	if o.Metrics != nil {
		mux.Handle("GET /metrics", o.Metrics.Handler())
	}
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		problem(w, http.StatusNotFound, "no such endpoint: "+asked(r)+": GET /v1/ lists the endpoints")
	})
	// A wrong method is answered by a pattern of the endpoint's own path
	// (not /v1/'s, nor the dashboard's 404), which the metrics label it
	// with.
	others := map[string]string{"/v1/policies": "GET", "/v1/stats": "GET", "/v1/status": "GET", "/v1/top": "GET", "/v1/{$}": "GET", "/v1/openapi.json": "GET",
		"/v1/check": "POST", "/v1/peek": "POST", "/v1/reset": "POST", "/v1/acquire": "POST", "/v1/extend": "POST", "/v1/release": "POST",
		"/json": "POST", "/healthz": "GET", "/readyz": "GET"}
	if o.Metrics != nil {
		others["/metrics"] = "GET"
	}
	for path, m := range others {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) { methodNotAllowed(w, r, m) })
	}
	if o.Dashboard == nil {
		o.Dashboard = placeholder{}
	}
	dash := o.Dashboard
	if _, ph := dash.(placeholder); !ph && !dashboard.IsBuiltin(dash) {
		// A custom dashboard is an application of its own (forms, streams):
		// it owns every path the API does not, answers every method itself,
		// and gets the connection's writer, Flush and all.
		mux.Handle("/", dash)
		return newRoutes(mux, o.Metrics != nil)
	}
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The dashboard's pages take GET alone, whatever the dashboard
		// answers other methods; a path it has no page for is 404. Only
		// the dashboard knows its paths: it is served the request itself
		// and its 404 stands, any other answer becoming the 405.
		page := r.URL.Path == "/" || r.URL.Path == "/index.html" || strings.HasPrefix(r.URL.Path, "/static/")
		dw := &dashboardWriter{ResponseWriter: w, r: r, getOnly: page && r.Method != http.MethodGet && r.Method != http.MethodHead}
		dash.ServeHTTP(dw, r)
		if dw.getOnly && !dw.answered {
			dw.WriteHeader(http.StatusOK) // it wrote nothing: an empty 200
		}
	}))
	return newRoutes(mux, o.Metrics != nil)
}

// routes is the service's handler, which can name a request's route
// without serving it.
type routes struct {
	http.Handler
	mux     *http.ServeMux
	metrics bool // /metrics is served
}

func newRoutes(mux *http.ServeMux, metrics bool) routes {
	h := routes{mux: mux, metrics: metrics}
	h.Handler = crossOrigin(http.HandlerFunc(h.serve))
	return h
}

// serve answers a request for an endpoint on a path that is not the
// endpoint's own (//v1/check, /v1/./check, /v1) with a 404 naming the
// path to send, where ServeMux would redirect it (307, as text/html):
// an API client must learn its URL is wrong, not have its POST sent
// again behind its back by some clients, refused or turned into a GET
// by others, and counted under the endpoint it never reached. The
// dashboard's pages keep ServeMux's redirect, which browsers follow.
func (h routes) serve(w http.ResponseWriter, r *http.Request) {
	if canonical, ok := h.misnamed(r); ok {
		detail := "no such endpoint: " + asked(r) + ": a path is taken as sent, neither cleaned nor redirected"
		if h.isRoute(r, canonical) {
			detail += ": send " + canonical
		} else {
			detail += ": GET /v1/ lists the endpoints"
		}
		problem(w, http.StatusNotFound, detail)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// misnamed reports whether r asks for one of the service's endpoints (the
// API, /json, the probes, /metrics) on a path ServeMux would redirect, and
// the path it would redirect to.
func (h routes) misnamed(r *http.Request) (string, bool) {
	sent := r.URL.EscapedPath()
	if sent == "/v1" { // ServeMux adds the slash, for any method
		return "/v1/", true
	}
	if r.Method == http.MethodConnect { // ServeMux matches its path as sent
		return "", false
	}
	clean := cleanPath(sent)
	if clean == sent {
		return "", false
	}
	switch base := strings.TrimSuffix(clean, "/"); {
	case base == "/v1", strings.HasPrefix(base, "/v1/"), strings.HasPrefix(sent, "/v1/"),
		base == "/json", base == "/healthz", base == "/readyz", base == "/metrics" && h.metrics:
		return clean, true
	}
	return "", false
}

// isRoute reports whether to names one of the service's endpoints (for
// any method), not a path only the catch-alls take.
func (h routes) isRoute(r *http.Request, to string) bool {
	probe := &http.Request{Method: r.Method, Host: r.Host, URL: &url.URL{Path: to}}
	_, p := h.mux.Handler(probe)
	if _, pathOnly, ok := strings.Cut(p, " "); ok { // after a method
		p = pathOnly
	}
	return p != "" && p != "/v1/" && p != "/"
}

// cleanPath is path as ServeMux routes it: rooted, without . and ..
// elements or repeated slashes, keeping a trailing slash.
func cleanPath(p string) string {
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean
}

// pattern is the route r would take, as ServeMux sets r.Pattern: for a
// request refused before it is routed (probesOnly), so that the metrics
// still label it with its endpoint. A misnamed endpoint's is none.
func (h routes) pattern(r *http.Request) string {
	if _, ok := h.misnamed(r); ok {
		return ""
	}
	_, p := h.mux.Handler(r)
	return p
}

type api struct {
	svc           *Service
	token         string
	decisionToken string
	adminMode     string
	health        *Health
}

type policyJSON struct {
	Name      string `json:"name"`
	Algorithm string `json:"algorithm"`
	Limit     string `json:"limit"`
	Rate      int64  `json:"rate"`
	PeriodMS  int64  `json:"period_ms"`
	Burst     int64  `json:"burst"`
	Shadow    bool   `json:"shadow"`
	LeaseMS   int64  `json:"lease_ms,omitempty"`
}

func (a *api) policies(w http.ResponseWriter, _ *http.Request) {
	cfg := a.svc.Config()
	out := make([]any, 0, len(cfg.Policies))
	for _, p := range cfg.Policies {
		if p.InFlight != nil {
			out = append(out, inFlightJSON(p))
			continue
		}
		l := p.Limit
		out = append(out, policyJSON{
			Name: p.Name, Algorithm: l.Algorithm.String(), Limit: l.String(), Rate: l.Rate,
			PeriodMS: l.Period.Milliseconds(), Burst: l.Capacity(), Shadow: p.Strategy == enforce.Shadow,
			LeaseMS: ceilMS(p.Lease),
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"policies": out})
}

type checkRequest struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
	// Cost omitted is the policy's cost; 0 only looks (check), or peeks
	// at the policy's cost (peek).
	Cost *int64 `json:"cost"`
}

type checkResponse struct {
	Policy       string `json:"policy"`
	Key          string `json:"key"`
	Allowed      bool   `json:"allowed"`
	ShadowDenied bool   `json:"shadow_denied,omitempty"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	ResetAfterMS int64  `json:"reset_after_ms"`
	// Source says who answered when the store itself did not: "lease"
	// (this instance's lease, without a store call), "deny_cache",
	// "fallback", "fail_open" or "fail_closed" (sluice.Source's names).
	Source string `json:"source,omitempty"`
}

// ceilMS rounds up, so a client waiting retry_after_ms is never early.
func ceilMS(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

func (a *api) check(w http.ResponseWriter, r *http.Request) {
	req, ok := authorizedJSON[checkRequest](w, r, a.decision)
	if !ok {
		return
	}
	if req.Policy == "" {
		problem(w, http.StatusBadRequest, "policy is required")
		return
	}
	var cost int64
	if req.Cost != nil {
		if cost = *req.Cost; cost < 0 {
			problem(w, http.StatusBadRequest, fmt.Sprintf("cost %d must be at least 0 (0 only looks)", cost))
			return
		}
	}
	peek := r.URL.Path == "/v1/peek"
	var res Result
	var err error
	switch {
	case peek:
		res, err = a.svc.Peek(r.Context(), req.Policy, req.Key, cost)
	case req.Cost != nil && cost == 0:
		res, err = a.svc.Look(r.Context(), req.Policy, req.Key)
	default:
		res, err = a.svc.Check(r.Context(), req.Policy, req.Key, cost)
	}
	if err != nil {
		serviceFailed(w, r, err)
		return
	}
	d := res.Decision
	body := checkResponse{
		Policy: res.Policy.Name, Key: res.Key, Allowed: d.Allowed, Limit: d.Limit.Capacity(),
		Remaining: d.Remaining, RetryAfterMS: ceilMS(d.RetryAfter), ResetAfterMS: ceilMS(d.ResetAfter),
	}
	if d.Source != sluice.SourceBackend {
		body.Source = d.Source.String()
	}
	code := http.StatusOK
	hd := d
	switch {
	case peek:
	case res.Look:
		hd.Allowed, hd.RetryAfter = true, 0 // a look is never refused: no Retry-After
	case res.ShadowDenied():
		body.ShadowDenied = true
		hd.Allowed, hd.RetryAfter = true, 0 // let through: no Retry-After
	case !res.Allowed:
		code = http.StatusTooManyRequests
	}
	header.All.Set(w.Header(), res.Policy.Name, hd, a.svc.clock())
	writeJSON(w, code, body)
}

type resetRequest struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
}

func (a *api) reset(w http.ResponseWriter, r *http.Request) {
	req, ok := authorizedJSON[resetRequest](w, r, a.admin)
	if !ok {
		return
	}
	if req.Policy == "" { // as /v1/check says it
		problem(w, http.StatusBadRequest, "policy is required")
		return
	}
	if err := a.svc.Reset(r.Context(), req.Policy, req.Key); err != nil {
		serviceFailed(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *api) stats(w http.ResponseWriter, _ *http.Request) {
	// Read before the series, so a reload in between can only make the
	// version older than the series, and the next poll reports it.
	version := a.svc.ConfigVersion()
	series := a.svc.Stats().Snapshot()
	body := map[string]any{
		"bucket_ms":      StatsBucket.Milliseconds(),
		"buckets":        StatsBuckets,
		"config_version": version,
		"series":         series,
	}
	a.svc.mon.addStats(body, series)
	writeJSON(w, http.StatusOK, body)
}

// jsonField matches the field protojson names in its errors, by its JSON
// name (hitsAddend).
var jsonField = regexp.MustCompile(`\bfield ([a-z][a-zA-Z0-9]*)`)

// jsonAt matches the position protojson gives its errors: "(line 1:84)",
// the line and the column (in characters) where the bad value starts.
var jsonAt = regexp.MustCompile(`\(line (\d+):(\d+)\)`)

// keyBefore matches the JSON key whose value ends the text it is run on.
var keyBefore = regexp.MustCompile(`"([A-Za-z_][A-Za-z0-9_]*)"\s*:\s*$`)

// protoFieldNames adds to the field protojson's message names by its JSON
// name the proto name, which Envoy's and envoyproxy/ratelimit's documents
// use: "field hits_addend (hitsAddend)". Either is accepted in a request.
// A wrapper's (a descriptor's hits_addend is a UInt64Value) is named
// "value" by protojson, the wrapper's own inner field, which the client
// never sent: the key in body before the error's position names it.
//
// Only that one: what follows it may quote the client's own value.
func protoFieldNames(msg string, body []byte) string {
	loc := jsonField.FindStringSubmatchIndex(msg)
	if loc == nil {
		return msg
	}
	name := msg[loc[2]:loc[3]]
	if name == "value" {
		if key := keyAt(msg, body); key != "" && key != name {
			name = key
		}
	}
	var b strings.Builder
	for _, r := range name {
		if unicode.IsUpper(r) {
			b.WriteByte('_')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	if b.String() == name {
		return msg[:loc[2]] + name + msg[loc[3]:]
	}
	return msg[:loc[2]] + b.String() + " (" + name + ")" + msg[loc[3]:]
}

// keyAt returns the key of the value at the position msg gives in body,
// or "".
func keyAt(msg string, body []byte) string {
	m := jsonAt.FindStringSubmatch(msg)
	if m == nil {
		return ""
	}
	line, _ := strconv.Atoi(m[1])
	col, _ := strconv.Atoi(m[2])
	rest := string(body)
	for ; line > 1; line-- {
		i := strings.IndexByte(rest, '\n')
		if i < 0 {
			return ""
		}
		rest = rest[i+1:]
	}
	off := len(body) - len(rest)
	for i := range rest { // col counts characters from 1
		if col--; col == 0 {
			k := keyBefore.FindStringSubmatch(string(body[:off+i]))
			if k == nil {
				return ""
			}
			name := k[1]
			if strings.Contains(name, "_") { // the proto name: as protojson would give the JSON one
				var b strings.Builder
				up := false
				for _, r := range name {
					if r == '_' {
						up = true
						continue
					}
					if up {
						r, up = unicode.ToUpper(r), false
					}
					b.WriteRune(r)
				}
				name = b.String()
			}
			return name
		}
	}
	return ""
}

// envoyJSON is ShouldRateLimit with a JSON body, as envoyproxy/ratelimit's
// /json endpoint: 200 when OK, 429 when over the limit.
func (a *api) envoyJSON(w http.ResponseWriter, r *http.Request) {
	if !a.decision(w, r) || !unencoded(w, r) {
		return
	}
	var req rlsv3.RateLimitRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		decodeError(w, err, &req)
		return
	}
	if err := protojson.Unmarshal(body, &req); err != nil {
		msg := scrub(err.Error())
		if esc, at := loneSurrogate(body); esc != "" && strings.Contains(msg, "escape") {
			// protojson names the text after the escape, not the escape.
			msg = fmt.Sprintf("%s at byte %d is half of a UTF-16 surrogate pair without its other half: send the character itself, or both halves", esc, at)
		}
		problem(w, http.StatusBadRequest, "the request body is not a RateLimitRequest in JSON: "+protoFieldNames(msg, body))
		return
	}
	resp, err := rlsServer{svc: a.svc}.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		switch status.Code(err) {
		case codes.Unavailable:
			serviceError(w, err)
			return
		case codes.Canceled, codes.DeadlineExceeded: // the request's own context ended
			abandoned(w, r)
			return
		}
		problem(w, http.StatusBadRequest, scrub(status.Convert(err).Message()))
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		problem(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}

// serviceFailed answers a request the service failed with err: the
// problem err is, unless the store did not answer because the request's
// own context ended while it waited. That is no store failure, so no 503
// telling the client to come back, and no decision either; it is answered
// as httplimit answers a request whose context ended while a Delay rule
// held it: a client gone hears nothing, so nothing is written, and a
// deadline set on the server's side is a 503 without Retry-After.
func serviceFailed(w http.ResponseWriter, r *http.Request, err error) {
	if code, _ := serviceProblem(err); code != http.StatusServiceUnavailable || ended(r.Context()) == nil {
		serviceError(w, err)
		return
	}
	abandoned(w, r)
}

// abandoned answers a request whose context ended while the store was
// awaited: nothing for a client gone, a 503 for a deadline passed.
func abandoned(w http.ResponseWriter, r *http.Request) {
	if errors.Is(ended(r.Context()), context.DeadlineExceeded) {
		problem(w, http.StatusServiceUnavailable, "the request's deadline passed while it waited for the rate-limit store")
	}
}

// ended is ctx's error, or DeadlineExceeded once its deadline has passed:
// a store call that its deadline cut short can return before ctx says so.
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// loneSurrogate finds a \u escape of a UTF-16 surrogate that is not
// part of a high-low pair, and its offset in body.
func loneSurrogate(body []byte) (string, int) {
	hex := func(i int) (rune, bool) {
		if i+6 > len(body) || body[i] != '\\' || body[i+1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(body[i+2:i+6]), 16, 16)
		return rune(n), err == nil
	}
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		r, ok := hex(i)
		if !ok {
			i++ // an escape of one character, \\ included
			continue
		}
		switch {
		case 0xD800 <= r && r < 0xDC00:
			if lo, ok := hex(i + 6); ok && 0xDC00 <= lo && lo < 0xE000 {
				i += 11
				continue
			}
		case 0xDC00 <= r && r < 0xE000:
		default:
			i += 5
			continue
		}
		return string(body[i : i+6]), i
	}
	return "", 0
}

// authorizedJSON lets allowed check the request's credentials, then decodes
// its JSON body into a T. ok is false once either has answered.
func authorizedJSON[T any](w http.ResponseWriter, r *http.Request, allowed func(http.ResponseWriter, *http.Request) bool) (req T, ok bool) {
	ok = allowed(w, r) && decodeJSON(w, r, &req)
	return req, ok
}

// decodeJSON reads one JSON object of at most MaxBodyBytes with no unknown
// fields; on failure it answers 400 (or 413) and returns false.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err == nil {
		err = validUTF8JSON(body)
	}
	if err == nil {
		err = exactFields(body, v)
	}
	if err == nil && isNull(body) {
		// Decoding null into a struct leaves it as it was: refuse it as
		// the decoder refuses any other body that is not an object.
		err = &json.UnmarshalTypeError{Value: "null", Type: reflect.TypeOf(v)}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err == nil {
		err = dec.Decode(v)
	}
	if err == nil {
		// More is false before '}' or ']', so ask for the next token.
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("server: bad request: the request body has more after its JSON object: send one object")
		}
	}
	if err != nil {
		decodeError(w, err, v)
		return false
	}
	return true
}

// isNull reports whether body's JSON value begins with null.
func isNull(body []byte) bool {
	t, err := json.NewDecoder(bytes.NewReader(body)).Token()
	return err == nil && t == nil
}

// exactFields refuses an object whose field names are not v's exactly,
// or that names a field twice: encoding/json matches names in any case
// and lets the last of two win, so {"policy":"p","key":"x","KEY":"victim"}
// would act on "victim", not the key the client can see. Anything else
// wrong with body is left for the decoder to report.
func exactFields(body []byte, v any) error {
	names := fieldNames(v)
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	seen := make(map[string]bool, len(names))
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil
		}
		name, _ := t.(string)
		if seen[name] {
			return fmt.Errorf("%w: field %q appears twice: send each field once", ErrBadRequest, name)
		}
		seen[name] = true
		if !slices.Contains(names, name) {
			return fmt.Errorf("json: unknown field %q", name) // as DisallowUnknownFields words it
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
		if string(skip) == "null" { // no field of the API is nullable
			return fmt.Errorf("%w: field %q is null: send a value, or leave the field out where it is optional", ErrBadRequest, name)
		}
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// methodNotAllowed answers 405 naming the method to use. A GET route
// serves HEAD too (ServeMux matches it), so Allow names both.
func methodNotAllowed(w http.ResponseWriter, r *http.Request, m string) {
	allow := m
	if m == http.MethodGet {
		allow = "GET, HEAD"
	}
	w.Header().Set("Allow", allow)
	problem(w, http.StatusMethodNotAllowed, "use "+m+" for "+asked(r)+", not "+r.Method)
}

// asked is r's path for a 404's or 405's detail: as requested, escaped
// (/v1%2fcheck is not /v1/check), and clipped.
func asked(r *http.Request) string {
	return clip(r.URL.EscapedPath(), logClip)
}

// dashboardWriter passes the dashboard's answers on, except a 404 or 405,
// which it answers as the API does, as a problem: every path the dashboard
// has no file for reaches it, and its own errors are text. With getOnly
// (another method than GET or HEAD on one of its page paths), any answer
// but 404 is a 405 naming GET.
type dashboardWriter struct {
	http.ResponseWriter
	r        *http.Request
	getOnly  bool
	answered bool // WriteHeader was called
	replaced bool // the dashboard's body is dropped
}

func (d *dashboardWriter) WriteHeader(code int) {
	if d.replaced || d.answered {
		return
	}
	if code >= 100 && code < 200 { // informational (103): the answer is still to come
		if !d.getOnly {
			d.ResponseWriter.WriteHeader(code)
		}
		return
	}
	d.answered = true
	h := d.Header()
	switch {
	case code == http.StatusNotFound:
		d.replace()
		problem(d.ResponseWriter, code, "no such page or endpoint: "+asked(d.r)+": GET /v1/ lists the API's endpoints")
	case d.getOnly:
		d.replace()
		methodNotAllowed(d.ResponseWriter, d.r, "GET")
	case code == http.StatusMethodNotAllowed:
		d.replace()
		detail := d.r.Method + " is not allowed for " + asked(d.r)
		if allow := h.Get("Allow"); allow != "" {
			detail = "use " + allow + " for " + asked(d.r) + ", not " + d.r.Method
		}
		problem(d.ResponseWriter, code, detail)
	default:
		d.ResponseWriter.WriteHeader(code)
	}
}

// replace drops the dashboard's body and the headers that describe it.
func (d *dashboardWriter) replace() {
	d.replaced = true
	for _, k := range []string{"Content-Length", "Content-Range", "Content-Encoding", "ETag", "Last-Modified"} {
		d.Header().Del(k)
	}
}

func (d *dashboardWriter) Write(b []byte) (int, error) {
	if !d.answered {
		d.WriteHeader(http.StatusOK)
	}
	if d.replaced {
		return len(b), nil
	}
	return d.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer;
// not while the answer may be replaced by a 405, which a flush would
// pre-empt.
func (d *dashboardWriter) Unwrap() http.ResponseWriter {
	if d.getOnly {
		return nil
	}
	return d.ResponseWriter
}

// problem writes an RFC 9457 problem details body.
func problem(w http.ResponseWriter, code int, detail string) {
	probjson.Write(w, probjson.New(code, detail))
}

// placeholder stands in for the dashboard when it is not built in.
type placeholder struct{}

func (placeholder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	io.WriteString(w, `<!doctype html><html><head><meta charset="utf-8"><title>sluice</title></head><body>
<h1>sluice</h1><p>The rate-limit service is running. JSON API: <a href="/v1/">/v1/</a>, described by
<a href="/v1/openapi.json">/v1/openapi.json</a>; metrics at <a href="/metrics">/metrics</a>.</p></body></html>
`)
}
