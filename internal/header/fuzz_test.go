package header

import (
	"errors"
	"net/url"
	"strconv"
	"testing"
)

// FuzzQuote: a policy name (any bytes: Envoy passes a rate_limit's name
// through) quotes to a structured-field string of printable ASCII that
// decodes back to it; Parse refuses what is not a selection's name.
func FuzzQuote(f *testing.F) {
	for _, s := range []string{"café", "cafè", "caf%C3%A9", "日本", "a\tb", "a\x7fb", "a%b", `a"b\c`, "standard", "all", "none", "ALL", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q := Quote(s)
		for i := 1; i < len(q)-1; i++ {
			if q[i] < 0x20 || q[i] > 0x7e {
				t.Fatalf("Quote(%q) = %q holds byte %#x", s, q, q[i])
			}
		}
		unq, err := strconv.Unquote(q)
		if err != nil {
			t.Fatalf("Quote(%q) = %s: %v", s, q, err)
		}
		if dec, err := url.PathUnescape(unq); err != nil || dec != s {
			t.Fatalf("Quote(%q) = %s decodes to %q, %v", s, q, dec, err)
		}
		if sel, err := Parse(s); err != nil {
			if !errors.Is(err, ErrSelection) {
				t.Fatalf("Parse(%q): %v", s, err)
			}
		} else if sel.String() != s {
			t.Fatalf("Parse(%q) = %v", s, sel)
		}
	})
}
