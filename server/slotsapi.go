package server

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/server/config"
)

// The JSON API's in-flight endpoints: POST /v1/acquire, /v1/extend and
// /v1/release. They translate; Service.Acquire, Extend and Release decide.

type acquireRequest struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
	// Weight omitted is 1.
	Weight *int64 `json:"weight"`
	// Priority omitted is critical, which no reserve sheds.
	Priority *string `json:"priority"`
}

type acquireResponse struct {
	Policy   string `json:"policy"`
	Key      string `json:"key"`
	Allowed  bool   `json:"allowed"`
	Token    string `json:"token,omitempty"`
	Weight   int64  `json:"weight"`
	Priority string `json:"priority"`
	// Shed: denied because the priority's share is full (503).
	Shed         bool  `json:"shed,omitempty"`
	Limit        int64 `json:"limit"`
	InUse        int64 `json:"in_use"`
	Remaining    int64 `json:"remaining"`
	HoldMS       int64 `json:"hold_ms"`
	RetryAfterMS int64 `json:"retry_after_ms"`
	// Source says who answered when the store did not: "fallback",
	// "fail_open" or "fail_closed", as /v1/check's.
	Source string `json:"source,omitempty"`
	// RetryAfterEstimate marks retry_after_ms (and Retry-After) as an
	// estimate: a slot may free at any instant, or be extended.
	RetryAfterEstimate bool `json:"retry_after_estimate,omitempty"`
}

// inFlightPolicyJSON is an in-flight policy in GET /v1/policies.
type inFlightPolicyJSON struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"` // "in_flight"
	Limit  string `json:"limit"`
	Max    int64  `json:"max"`
	HoldMS int64  `json:"hold_ms"`
	// Reserve is the shares held back for critical and normal requests.
	Reserve struct {
		Critical float64 `json:"critical"`
		Normal   float64 `json:"normal"`
	} `json:"reserve"`
}

func inFlightJSON(p *config.Policy) inFlightPolicyJSON {
	f := p.InFlight
	out := inFlightPolicyJSON{Name: p.Name, Kind: "in_flight", Limit: f.String(), Max: f.Limit.Max, HoldMS: f.Limit.Hold.Milliseconds()}
	out.Reserve.Critical, out.Reserve.Normal = f.Reserve.Critical, f.Reserve.Normal
	return out
}

type tokenRequest struct {
	Token string `json:"token"`
}

// decisionBody authorizes a decision endpoint's request and decodes its
// body into v; on failure it has answered and returns false.
func (a *api) decisionBody(w http.ResponseWriter, r *http.Request, v any) bool {
	return a.decision(w, r) && decodeJSON(w, r, v)
}

func (a *api) acquire(w http.ResponseWriter, r *http.Request) {
	var req acquireRequest
	if !a.decisionBody(w, r, &req) {
		return
	}
	weight := int64(1)
	if req.Weight != nil {
		weight = *req.Weight
	}
	prio := sluice.PriorityCritical
	if req.Priority != nil {
		p, err := sluice.ParsePriority(*req.Priority)
		if err != nil {
			problem(w, http.StatusBadRequest, fmt.Sprintf("priority %q is unknown: send critical, normal or sheddable (or leave it out for critical)", *req.Priority))
			return
		}
		prio = p
	}
	res, err := a.svc.Acquire(r.Context(), req.Policy, req.Key, weight, prio)
	if err != nil {
		serviceFailed(w, r, err)
		return
	}
	d := res.Decision
	body := acquireResponse{
		Policy: res.Policy.Name, Key: res.Key, Allowed: d.Allowed, Token: res.Token, Weight: res.Weight,
		Priority: res.Priority.String(), Shed: res.Shed, Limit: d.Limit.Max, InUse: d.InUse, Remaining: d.Remaining,
		HoldMS: d.Limit.Hold.Milliseconds(), RetryAfterMS: ceilMS(d.RetryAfter),
	}
	if d.Source != sluice.SourceBackend {
		body.Source = d.Source.String()
	}
	code := http.StatusOK
	if !d.Allowed {
		code = http.StatusTooManyRequests
		if res.Shed {
			code = http.StatusServiceUnavailable
		}
		body.RetryAfterEstimate = true
		w.Header().Set("Retry-After", strconv.FormatInt(max(1, (body.RetryAfterMS+999)/1000), 10))
	}
	writeJSON(w, code, body)
}

func (a *api) extend(w http.ResponseWriter, r *http.Request) {
	var req tokenRequest
	if !a.decisionBody(w, r, &req) {
		return
	}
	hold, err := a.svc.Extend(r.Context(), req.Token)
	if err != nil {
		serviceFailed(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"hold_ms": hold.Milliseconds()})
}

// releaseTimeout bounds a release made after its client hung up.
const releaseTimeout = 2 * time.Second

func (a *api) release(w http.ResponseWriter, r *http.Request) {
	var req tokenRequest
	if !a.decisionBody(w, r, &req) {
		return
	}
	// A release the client asked for is made even if it hangs up: lost,
	// its slot would stay taken until the hold timeout.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), releaseTimeout)
	defer cancel()
	if err := a.svc.Release(ctx, req.Token); err != nil {
		serviceError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
