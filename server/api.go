package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/internal/header"
	probjson "github.com/sluicehq/sluice/internal/problem"
)

// MaxBodyBytes bounds JSON request bodies.
const MaxBodyBytes = 64 << 10

// HandlerOptions configures the HTTP handler. A nil *HandlerOptions is valid.
type HandlerOptions struct {
	// AdminToken, when set, is the bearer token admin endpoints (reset)
	// require. When empty, admin endpoints answer loopback clients only.
	AdminToken string
	// Ready reports whether the store is reachable, for /readyz. Default:
	// always ready.
	Ready func(context.Context) error
	// Metrics is served at /metrics when set.
	Metrics *Metrics
	// Dashboard is served at "/". Default: a placeholder page.
	Dashboard http.Handler
}

// newHandler is Service.Handler.
func newHandler(s *Service, opts *HandlerOptions) http.Handler {
	var o HandlerOptions
	if opts != nil {
		o = *opts
	}
	a := &api{svc: s, token: o.AdminToken, ready: o.Ready}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/policies", a.policies)
	mux.HandleFunc("POST /v1/check", a.check)
	mux.HandleFunc("POST /v1/peek", a.check)
	mux.HandleFunc("POST /v1/reset", a.reset)
	mux.HandleFunc("GET /v1/stats", a.stats)
	mux.HandleFunc("POST /json", a.envoyJSON)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", a.readyz)
	if o.Metrics != nil {
		mux.Handle("GET /metrics", o.Metrics.Handler())
	}
	allow := map[string]string{"/v1/policies": "GET", "/v1/stats": "GET", "/v1/check": "POST", "/v1/peek": "POST", "/v1/reset": "POST"}
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		if m, ok := allow[r.URL.Path]; ok {
			w.Header().Set("Allow", m)
			problem(w, http.StatusMethodNotAllowed, r.Method+" "+r.URL.Path+": use "+m)
			return
		}
		problem(w, http.StatusNotFound, "no such endpoint: "+r.URL.Path)
	})
	if o.Dashboard == nil {
		o.Dashboard = placeholder{}
	}
	mux.Handle("/", o.Dashboard)
	return mux
}

type api struct {
	svc   *Service
	token string
	ready func(context.Context) error
}

type policyJSON struct {
	Name      string `json:"name"`
	Algorithm string `json:"algorithm"`
	Limit     string `json:"limit"`
	Rate      int64  `json:"rate"`
	PeriodMS  int64  `json:"period_ms"`
	Burst     int64  `json:"burst"`
	Shadow    bool   `json:"shadow"`
}

func (a *api) policies(w http.ResponseWriter, _ *http.Request) {
	cfg := a.svc.Config()
	out := make([]policyJSON, 0, len(cfg.Policies))
	for _, p := range cfg.Policies {
		l := p.Limit
		out = append(out, policyJSON{
			Name: p.Name, Algorithm: l.Algorithm.String(), Limit: l.String(), Rate: l.Rate,
			PeriodMS: l.Period.Milliseconds(), Burst: l.Capacity(), Shadow: p.Strategy == enforce.Shadow,
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
}

// ceilMS rounds up, so a client waiting retry_after_ms is never early.
func ceilMS(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

func (a *api) check(w http.ResponseWriter, r *http.Request) {
	var req checkRequest
	if !decodeJSON(w, r, &req) {
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
		serviceError(w, err)
		return
	}
	d := res.Decision
	body := checkResponse{
		Policy: res.Policy.Name, Key: res.Key, Allowed: d.Allowed, Limit: d.Limit.Capacity(),
		Remaining: d.Remaining, RetryAfterMS: ceilMS(d.RetryAfter), ResetAfterMS: ceilMS(d.ResetAfter),
	}
	code := http.StatusOK
	hd := d
	switch {
	case peek:
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
	if !a.admin(w, r) {
		return
	}
	var req resetRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	if err := a.svc.Reset(r.Context(), req.Policy, req.Key); err != nil {
		serviceError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// admin applies the admin rule: the bearer token when one is configured,
// else loopback clients only. The peer address is used as is: forwarding
// headers are not trusted here.
func (a *api) admin(w http.ResponseWriter, r *http.Request) bool {
	if a.token != "" {
		auth := r.Header.Get("Authorization")
		got, ok := strings.CutPrefix(auth, "Bearer ")
		if auth == "" || !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
			problem(w, http.StatusUnauthorized, "admin endpoint: send Authorization: Bearer <admin token>")
			return false
		}
		if subtle.ConstantTimeCompare([]byte(got), []byte(a.token)) != 1 {
			problem(w, http.StatusForbidden, "admin endpoint: wrong admin token")
			return false
		}
		return true
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		problem(w, http.StatusForbidden, "admin endpoint: without an admin token only loopback clients may call it")
		return false
	}
	return true
}

func (a *api) stats(w http.ResponseWriter, _ *http.Request) {
	// Read before the series, so a reload in between can only make the
	// version older than the series, and the next poll reports it.
	version := a.svc.ConfigVersion()
	writeJSON(w, http.StatusOK, map[string]any{
		"bucket_ms":      StatsBucket.Milliseconds(),
		"buckets":        StatsBuckets,
		"config_version": version,
		"series":         a.svc.Stats().Snapshot(),
	})
}

func (a *api) readyz(w http.ResponseWriter, r *http.Request) {
	if a.ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := a.ready(ctx); err != nil {
			problem(w, http.StatusServiceUnavailable, "store not reachable: "+err.Error())
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "ok\n")
}

// envoyJSON is ShouldRateLimit with a JSON body, as envoyproxy/ratelimit's
// /json endpoint: 200 when OK, 429 when over the limit.
func (a *api) envoyJSON(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		problem(w, http.StatusRequestEntityTooLarge, err.Error())
		return
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		problem(w, http.StatusBadRequest, "malformed JSON: "+err.Error())
		return
	}
	resp, err := rlsServer{svc: a.svc}.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		code := http.StatusBadRequest
		if status.Code(err) == codes.Unavailable {
			code = http.StatusServiceUnavailable
		}
		problem(w, code, status.Convert(err).Message())
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

// decodeJSON reads one JSON object of at most MaxBodyBytes with no unknown
// fields; on failure it answers 400 (or 413) and returns false.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// More is false before '}' or ']', so ask for the next token.
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("unexpected data after the JSON object")
		}
	}
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			problem(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit))
			return false
		}
		if errors.Is(err, io.EOF) {
			err = errors.New("empty body")
		}
		problem(w, http.StatusBadRequest, "malformed JSON: "+err.Error())
		return false
	}
	return true
}

func serviceError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrUnknownPolicy):
		problem(w, http.StatusNotFound, err.Error())
	case errors.Is(err, ErrBadRequest), errors.Is(err, sluice.ErrInvalidKey),
		errors.Is(err, sluice.ErrInvalidCost), errors.Is(err, sluice.ErrCostExceedsBurst):
		problem(w, http.StatusBadRequest, err.Error())
	default:
		problem(w, http.StatusServiceUnavailable, err.Error())
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
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
<h1>sluice</h1><p>The rate-limit service is running. JSON API: <a href="/v1/policies">/v1/policies</a>,
<a href="/v1/stats">/v1/stats</a>; metrics at <a href="/metrics">/metrics</a>.</p></body></html>
`)
}
