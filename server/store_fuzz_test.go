package server

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/resilient"
)

// FuzzParseFailurePolicy: a name ParseFailurePolicy does not accept is
// resilient.ErrUnknownPolicy, never a panic; one it accepts reads back
// from the policy's own name ("error" for none) as the same; and every
// name resilient.ParsePolicy accepts, it accepts as the same policy.
func FuzzParseFailurePolicy(f *testing.F) {
	for _, s := range []string{"", " ", "local", "open", "closed", "error", "none", "fallback", "fallback-local", "fail-open", "fail-closed",
		"fail_open", "FAIL_CLOSED", " Local ", "ERROR", "None ", "\terror\n", "fallback_local", "sometimes", "errors", "no", "off", "local,open",
		"loca", "ope\u0301n", "\u212aey", "fallbac\u212a", "LOCAL\x00", "é", "error-", "-error", "e_rror", "none_", "\u00a0open\u00a0", "\u2028closed"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, ok, err := ParseFailurePolicy(s)
		if err != nil {
			if !errors.Is(err, resilient.ErrUnknownPolicy) {
				t.Fatalf("ParseFailurePolicy(%q): %v, want resilient.ErrUnknownPolicy", s, err)
			}
			if p != 0 || ok {
				t.Fatalf("ParseFailurePolicy(%q) = %v, %v with the error %v", s, p, ok, err)
			}
			if !strings.Contains(err.Error(), "want error, local, open or closed") {
				t.Fatalf("ParseFailurePolicy(%q): %v, which does not say what is accepted", s, err)
			}
		} else {
			name := "error"
			if ok {
				name = p.String()
			} else if p != 0 {
				t.Fatalf("ParseFailurePolicy(%q) = %v without a policy", s, p)
			}
			back, backOK, err := ParseFailurePolicy(name)
			if err != nil || back != p || backOK != ok {
				t.Fatalf("ParseFailurePolicy(%q) = %v, %v; its name %q reads back as %v, %v, %v", s, p, ok, name, back, backOK, err)
			}
		}
		if rp, rerr := resilient.ParsePolicy(s); rerr == nil && (err != nil || !ok || p != rp) {
			t.Fatalf("resilient.ParsePolicy(%q) = %v, but ParseFailurePolicy: %v, %v, %v", s, rp, p, ok, err)
		}
	})
}
