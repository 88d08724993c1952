package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sluicehq/sluice/server/config"
)

// readyz answers 200 while this instance can answer decisions under its
// failure policy, 503 otherwise; the body names any degradation.
func (a *api) readyz(w http.ResponseWriter, r *http.Request) {
	st := a.health.ready(r.Context())
	if !st.Ready {
		problem(w, http.StatusServiceUnavailable, "not ready: "+strings.Join(st.Reasons, "; "))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if st.Degraded {
		fmt.Fprintf(w, "ok, degraded: %s\n", strings.Join(st.Reasons, "; "))
		return
	}
	io.WriteString(w, "ok\n")
}

// status serves /v1/status: readiness, degradation and its reasons, the
// store's state, the admin mode and the configuration in force (with a
// rejected reload's errors), for operators and the dashboard.
func (a *api) status(w http.ResponseWriter, r *http.Request) {
	st := a.health.ready(r.Context())
	st.Admin = a.adminMode
	cs := a.svc.ConfigStatus()
	st.Config = &cs
	writeJSON(w, http.StatusOK, st)
}

var errBadUTF8 = errors.New("invalid UTF-8 in the request body: keys are compared byte for byte, so it would stand for a different key")

// validUTF8JSON refuses a body that encoding/json would silently change:
// invalid UTF-8, or an escaped lone surrogate, both of which become U+FFFD
// (distinct keys would then share one counter).
func validUTF8JSON(body []byte) error {
	if !utf8.Valid(body) {
		return errBadUTF8
	}
	pendingHigh := false
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' || i+1 >= len(body) {
			if pendingHigh {
				return errBadUTF8
			}
			continue
		}
		i++ // the escaped character
		if body[i] != 'u' || i+4 >= len(body) {
			if pendingHigh {
				return errBadUTF8
			}
			continue
		}
		r, err := strconv.ParseUint(string(body[i+1:i+5]), 16, 16)
		i += 4
		switch {
		case err != nil:
			return nil // the decoder reports the malformed escape
		case r >= 0xD800 && r < 0xDC00: // high surrogate: a low one must follow
			if pendingHigh {
				return errBadUTF8
			}
			pendingHigh = true
		case r >= 0xDC00 && r < 0xE000:
			if !pendingHigh {
				return errBadUTF8
			}
			pendingHigh = false
		default:
			if pendingHigh {
				return errBadUTF8
			}
		}
	}
	if pendingHigh {
		return errBadUTF8
	}
	return nil
}

// ErrNoPolicies: a configuration without policies, which would let every
// request through, and does not say allow_empty: true.
var ErrNoPolicies = errors.New("the configuration has no policies (say allow_empty: true in it to run without any)")

// requirePolicies refuses an empty configuration unless it says so: an
// emptied file must not silently drop every limit. Blocks limit too.
func requirePolicies(cfg *config.Config) error {
	if len(cfg.Policies) == 0 && cfg.Blocks() == 0 && !cfg.AllowEmpty {
		return fmt.Errorf("%s: %w", strings.Join(cfg.Files, ", "), ErrNoPolicies)
	}
	return nil
}
