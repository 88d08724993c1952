package enforce

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// unescapeKey undoes EscapeKey; ok is false for text EscapeKey never writes.
func unescapeKey(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '{' || c == '}':
			return "", false
		case c != '%':
			b.WriteByte(c)
		case i+2 < len(s) && (s[i+1:i+3] == "25" || s[i+1:i+3] == "7B" || s[i+1:i+3] == "7D"):
			n, _ := strconv.ParseUint(s[i+1:i+3], 16, 8)
			b.WriteByte(byte(n))
			i += 2
		default:
			return "", false
		}
	}
	return b.String(), true
}

func TestEscapeKey(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                "",
		"bob":             "bob",
		"GET /items/{id}": "GET /items/%7Bid%7D",
		"{x}":             "%7Bx%7D",
		"}bob":            "%7Dbob",
		"50%":             "50%25",
		"%7B":             "%257B",
		"{%}":             "%7B%25%7D",
		"2001:db8::/64":   "2001:db8::/64",
	} {
		if got := EscapeKey(in); got != want {
			t.Errorf("EscapeKey(%q) = %q, want %q", in, got, want)
		}
	}
}

// EscapeKey is injective and no brace survives it: random texts over an
// alphabet rich in '%', '{', '}' and hex digits decode back to themselves
// and never meet.
func TestEscapeKeyInjective(t *testing.T) {
	t.Parallel()
	const alphabet = "%{}7BbD25d:a"
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[string]string{}
	for range 200000 {
		b := make([]byte, rng.IntN(7))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		in := string(b)
		out := EscapeKey(in)
		if strings.ContainsAny(out, "{}") {
			t.Fatalf("EscapeKey(%q) = %q keeps a brace", in, out)
		}
		if back, ok := unescapeKey(out); !ok || back != in {
			t.Fatalf("EscapeKey(%q) = %q decodes to %q, %v", in, out, back, ok)
		}
		if prev, ok := seen[out]; ok && prev != in {
			t.Fatalf("%q and %q both escape to %q", prev, in, out)
		}
		seen[out] = in
	}
}

func FuzzEscapeKey(f *testing.F) {
	for _, s := range []string{"", "{id}", "%7B", "}x", "a{b}c%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out := EscapeKey(in)
		if strings.ContainsAny(out, "{}") {
			t.Fatalf("EscapeKey(%q) = %q keeps a brace", in, out)
		}
		if back, ok := unescapeKey(out); !ok || back != in {
			t.Fatalf("EscapeKey(%q) = %q decodes to %q, %v", in, out, back, ok)
		}
	})
}
