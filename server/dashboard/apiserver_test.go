package dashboard

import (
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"

	"sluice"
	"sluice/memory"
)

// apiServer is a small stand-in for the service's JSON API, built on the real
// memory store and sluice.Limiter, so the dashboard can be tested in a browser
// on its own. It implements only what the dashboard calls, as the service
// documents it:
//
//	GET  /v1/policies  {"policies":[{name, algorithm, limit, rate, period_ms, burst, shadow}]}
//	POST /v1/check     {policy, key, cost} → 200 allowed / 429 denied (200 + shadow_denied in shadow mode)
//	POST /v1/peek      same body → 200
//	POST /v1/reset     {policy, key} → 204; needs "Authorization: Bearer <token>"
//	GET  /v1/stats     {bucket_ms, buckets, series:[{policy, allowed, denied}]}, oldest first
//
// Its clock is frozen: a burst never straddles a window edge, so a test can
// compute exactly how many requests are denied.
type apiServer struct {
	token    string
	now      time.Time
	policies []apiPolicy
	store    *memory.Store

	mu    sync.Mutex
	stats map[string]map[int64][2]int64 // policy → bucket number → allowed, denied
}

type apiPolicy struct {
	name    string
	shadow  bool
	limiter *sluice.Limiter
}

const (
	statsBucket  = 5 * time.Second
	statsBuckets = 60
)

// demoPolicy configures one policy of the stand-in server.
type demoPolicy struct {
	name, limit string // limit as ParseLimit reads it
	shadow      bool
}

func newAPIServer(token string, now time.Time, policies []demoPolicy) (*apiServer, error) {
	s := &apiServer{
		token: token,
		now:   now,
		store: memory.New(&memory.Options{Clock: func() time.Time { return now }, SweepInterval: -1}),
		stats: make(map[string]map[int64][2]int64),
	}
	for _, dp := range policies {
		l, err := sluice.ParseLimit(dp.limit)
		if err != nil {
			return nil, err
		}
		lim, err := sluice.NewLimiter(s.store, l, &sluice.Options{Prefix: dp.name + ":"})
		if err != nil {
			return nil, err
		}
		s.policies = append(s.policies, apiPolicy{name: dp.name, shadow: dp.shadow, limiter: lim})
	}
	return s, nil
}

func (s *apiServer) Close() error { return s.store.Close() }

func (s *apiServer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", Handler())
	mux.HandleFunc("GET /v1/policies", s.listPolicies)
	mux.HandleFunc("POST /v1/check", s.check)
	mux.HandleFunc("POST /v1/peek", s.check)
	mux.HandleFunc("POST /v1/reset", s.reset)
	mux.HandleFunc("GET /v1/stats", s.listStats)
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func problem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"title": http.StatusText(status), "status": status, "detail": detail})
}

func (s *apiServer) policy(name string) (apiPolicy, bool) {
	for _, p := range s.policies {
		if p.name == name {
			return p, true
		}
	}
	return apiPolicy{}, false
}

func (s *apiServer) listPolicies(w http.ResponseWriter, _ *http.Request) {
	type policyJSON struct {
		Name      string `json:"name"`
		Algorithm string `json:"algorithm"`
		Limit     string `json:"limit"`
		Rate      int64  `json:"rate"`
		PeriodMS  int64  `json:"period_ms"`
		Burst     int64  `json:"burst"`
		Shadow    bool   `json:"shadow"`
	}
	out := make([]policyJSON, 0, len(s.policies))
	for _, p := range s.policies {
		l := p.limiter.Limit()
		out = append(out, policyJSON{
			Name: p.name, Algorithm: l.Algorithm.String(), Limit: l.String(),
			Rate: l.Rate, PeriodMS: l.Period.Milliseconds(), Burst: l.Capacity(), Shadow: p.shadow,
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"policies": out})
}

type checkRequest struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
	Cost   int64  `json:"cost"`
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		problem(w, http.StatusBadRequest, "malformed JSON: "+err.Error())
		return false
	}
	return true
}

func (s *apiServer) check(w http.ResponseWriter, r *http.Request) {
	var req checkRequest
	if !decode(w, r, &req) {
		return
	}
	p, ok := s.policy(req.Policy)
	if !ok {
		problem(w, http.StatusNotFound, "unknown policy "+req.Policy)
		return
	}
	if req.Cost == 0 {
		req.Cost = 1
	}
	peek := r.URL.Path == "/v1/peek"
	var d sluice.Decision
	var err error
	if peek {
		d, err = p.limiter.Peek(r.Context(), req.Key)
	} else {
		d, err = p.limiter.AllowN(r.Context(), req.Key, req.Cost)
	}
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, sluice.ErrInvalidKey) || errors.Is(err, sluice.ErrInvalidCost) || errors.Is(err, sluice.ErrCostExceedsBurst) {
			status = http.StatusBadRequest
		}
		problem(w, status, err.Error())
		return
	}
	body := map[string]any{
		"policy": p.name, "key": req.Key, "allowed": d.Allowed, "limit": d.Limit.Capacity(),
		"remaining": d.Remaining, "retry_after_ms": d.RetryAfter.Milliseconds(), "reset_after_ms": d.ResetAfter.Milliseconds(),
	}
	status := http.StatusOK
	if !peek {
		s.record(p.name, d.Allowed)
		switch {
		case !d.Allowed && p.shadow:
			body["shadow_denied"] = true
		case !d.Allowed:
			status = http.StatusTooManyRequests
		}
	}
	writeJSON(w, status, body)
}

func (s *apiServer) reset(w http.ResponseWriter, r *http.Request) {
	switch auth := r.Header.Get("Authorization"); {
	case auth == "":
		w.Header().Set("WWW-Authenticate", "Bearer")
		problem(w, http.StatusUnauthorized, "admin token required")
		return
	case auth != "Bearer "+s.token:
		problem(w, http.StatusForbidden, "admin token refused")
		return
	}
	var req struct {
		Policy string `json:"policy"`
		Key    string `json:"key"`
	}
	if !decode(w, r, &req) {
		return
	}
	p, ok := s.policy(req.Policy)
	if !ok {
		problem(w, http.StatusNotFound, "unknown policy "+req.Policy)
		return
	}
	if err := p.limiter.Reset(r.Context(), req.Key); err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *apiServer) record(policy string, allowed bool) {
	b := s.now.UnixMilli() / statsBucket.Milliseconds()
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.stats[policy]
	if m == nil {
		m = make(map[int64][2]int64)
		s.stats[policy] = m
	}
	c := m[b]
	if allowed {
		c[0]++
	} else {
		c[1]++
	}
	m[b] = c
}

func (s *apiServer) listStats(w http.ResponseWriter, _ *http.Request) {
	type seriesJSON struct {
		Policy  string  `json:"policy"`
		Allowed []int64 `json:"allowed"`
		Denied  []int64 `json:"denied"`
	}
	last := s.now.UnixMilli() / statsBucket.Milliseconds()
	s.mu.Lock()
	series := make([]seriesJSON, 0, len(s.policies))
	for _, p := range s.policies {
		sj := seriesJSON{Policy: p.name, Allowed: make([]int64, statsBuckets), Denied: make([]int64, statsBuckets)}
		for i := range statsBuckets {
			c := s.stats[p.name][last-statsBuckets+1+int64(i)]
			sj.Allowed[i], sj.Denied[i] = c[0], c[1]
		}
		series = append(series, sj)
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"bucket_ms": statsBucket.Milliseconds(), "buckets": statsBuckets, "series": series})
}
