package config

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

// testConfigs returns the configuration texts this package's tests and
// testdata hold: the string literals of its _test.go files that look like
// a configuration, and every YAML file under testdata. They seed the fuzz
// targets, so that the corpus follows the tests.
func testConfigs(tb testing.TB) []string {
	tb.Helper()
	var out []string
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		tb.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			tb.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err == nil && (strings.Contains(s, "policies:") || strings.Contains(s, "descriptors:") || strings.Contains(s, "domain:")) {
				out = append(out, strings.ReplaceAll(s, "VALUE", "true"))
			}
			return true
		})
	}
	err = filepath.WalkDir("testdata", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		b, err := os.ReadFile(path)
		out = append(out, string(b))
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// checkConfigError holds a refused configuration's error to what Load
// and Parse promise: it wraps ErrConfig, and each problem is an *Error
// naming the file and, but for an empty file, a line of it.
func checkConfigError(t *testing.T, data []byte, err error) {
	t.Helper()
	checkFilesError(t, map[string][]byte{"fuzz.yaml": data}, err)
}

// checkFilesError is checkConfigError for a configuration of several
// files: files maps each name to its text.
func checkFilesError(t *testing.T, files map[string][]byte, err error) {
	t.Helper()
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("error does not wrap ErrConfig: %v", err)
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		var ce *Error
		if !errors.As(e, &ce) {
			t.Fatalf("a problem is not a *config.Error: %v", e)
		}
		data, ok := files[ce.File]
		if !ok {
			t.Fatalf("problem names file %q: %v", ce.File, e)
		}
		if ce.Msg == "empty configuration" {
			continue
		}
		// YAML breaks lines at \r too (and at NEL, LS and PS): count them all.
		lines := 1
		for _, br := range []string{"\n", "\r", "\u0085", "\u2028", "\u2029"} {
			lines += strings.Count(string(data), br)
		}
		if ce.Line < 1 || ce.Line > lines {
			t.Fatalf("problem names line %d of %d: %v", ce.Line, lines, e)
		}
	}
}

// FuzzParse feeds configuration text, in either format, to Parse (what
// Load does with each file): it never panics; a refusal is an ErrConfig
// naming file:line; a configuration that loads describes itself the same
// on a second load, its limits read back from their text, and every key
// a descriptor renders is one the JSON API reaches.
func FuzzParse(f *testing.F) {
	for _, s := range testConfigs(f) {
		f.Add([]byte(s), "user", "bob", "ip", "2001:db8::1")
		// YAML breaks lines at CR LF and at a lone CR too.
		for _, br := range []string{"\r\n", "\r"} {
			f.Add([]byte(strings.ReplaceAll(s, "\n", br)), "user", "bob", "ip", "2001:db8::1")
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, k1, v1, k2, v2 string) {
		cfg, err := Parse("fuzz.yaml", data)
		if err != nil {
			checkConfigError(t, data, err)
			return
		}
		var first, second strings.Builder
		cfg.Describe(&first)
		again, err := Parse("fuzz.yaml", data)
		if err != nil {
			t.Fatalf("loads once, then: %v", err)
		}
		again.Describe(&second)
		if first.String() != second.String() {
			t.Fatalf("two loads differ:\n%s\n%s", first.String(), second.String())
		}
		for _, p := range cfg.Policies {
			if p.InFlight != nil {
				continue
			}
			checkLimitText(t, p.Limit)
			for _, o := range p.Overrides {
				checkLimitText(t, o.Limit)
			}
		}
		for _, entries := range [][]Entry{{{k1, v1}}, {{k1, v1}, {k2, v2}}, {{routingEntry, k1}, {k2, v2}}} {
			for _, name := range cfg.Domains() {
				m, ok := cfg.Domain(name).Match(entries)
				if !ok {
					continue
				}
				p := m.Policy
				if m.RateLimit != nil {
					p = m.RateLimit.Policy
				}
				if p != nil && !cfg.Reaches(p, m.Key) {
					t.Fatalf("%v renders %q under %s, which the JSON API does not reach (%s)", entries, m.Key, p.Name, p.KeyEscapeProblem(m.Key))
				}
			}
		}
	})
}

// checkLimitText: a loaded limit reads back from its text as itself (a
// burst equal to the rate is the default, which the text leaves out).
func checkLimitText(t *testing.T, l sluice.Limit) {
	t.Helper()
	back, err := sluice.ParseLimit(l.String())
	if l.Burst == l.Rate {
		l.Burst = 0
	}
	if err != nil || back != l {
		t.Fatalf("limit %#v is written %q, which reads back as %#v, %v", l, l.String(), back, err)
	}
}

// FuzzKeyTemplate: a key template parses or is refused, never panics; a
// template's rendered keys hold no brace, are the JSON API's spelling of
// themselves, and split back into the values that rendered them; any
// other key is judged without a panic.
func FuzzKeyTemplate(f *testing.F) {
	for _, s := range []string{"{key}", "{a}", "k{a}", "{a}:{b}", "x{a}/{b}-{c}y", "{a}:-{b}", "{a}::{b}:{c}", "u={user}:{ip}", "<{k}>", "{user", "{u}{r}", "100%:{u}", "{u}%{r}", "fixed", "{policy}:{user}", "{a}}", "}{a}", "{}", "%25{a}%7B",
		"{a}{a}", "{a}%7D", "{ a }", "{a:b}", "{é}", "%{a}", "{a}%", "{a}%2", "{a}%25{b}"} {
		f.Add(s, "bob", "a:b%{}", "2001:db8::1", "%41")
		f.Add(s, "", ":", "%7B%25", "{a}")
	}
	f.Fuzz(func(t *testing.T, tmpl, v1, v2, v3, other string) {
		tt, err := parseTemplate(tmpl)
		if err != nil {
			return
		}
		vals := []string{v1, v2, v3}
		entries := make([]Entry, len(tt.vars))
		for i, v := range tt.vars {
			entries[i] = Entry{v, vals[i%len(vals)]}
		}
		key, ok := tt.render(entries, nil)
		if !ok {
			t.Fatalf("%q: render(%v) failed", tmpl, entries)
		}
		if strings.ContainsAny(key, "{}") {
			t.Fatalf("%q: %v renders %q, with a brace", tmpl, entries, key)
		}
		p := &Policy{tmpl: tt}
		if why := p.KeyEscapeProblem(key); why != "" {
			t.Fatalf("%q: %v renders %q, refused: %s", tmpl, entries, key, why)
		}
		raws, ok := tt.split(key)
		if !ok || len(raws) != len(entries) {
			t.Fatalf("%q: %q does not split back: %q, %v", tmpl, key, raws, ok)
		}
		for i, raw := range raws {
			if v, ok := unescape(raw); !ok || v != entries[i].Value {
				t.Fatalf("%q: %q splits into %q, value %d %q, want %q", tmpl, key, raws, i, v, entries[i].Value)
			}
		}
		_ = p.KeyEscapeProblem(other)
		_ = EscapeProblem(other)
	})
}

// FuzzLoadDir loads a directory of two files, a.yaml and b.yml, of any
// text: it never panics; a refusal is an ErrConfig naming file:line of one
// of them, whose first problems are a.yaml's alone (Load reads the files
// in order); and a second load agrees with the first, error or
// configuration.
func FuzzLoadDir(f *testing.F) {
	configs := testConfigs(f)
	for i, s := range configs {
		f.Add([]byte(s), []byte(configs[(i+1)%len(configs)]))
		f.Add([]byte(s), []byte(s)) // the same names in both files
	}
	for _, p := range [][2]string{
		{"policies:\n  - name: p\n    limit: 1/s\n", "policies:\n  - name: q\n    limit: 2/s\n"},
		{"policies:\n  - name: p\n    limit: 1/s\n", "domain: sluice\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"},
		{"domain: sluice\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "policies:\n  - name: p\n    limit: 1/s\n"},
		{"domain: one\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "domain: one\n"},
		{"domain: one\n", "domain: two\npolicies:\n  - name: p\n    limit: 1/s\n"},
		{"allow_empty: true\npolicies: []\n", "allow_empty: false\npolicies: []\n"},
		{"policies:\n  - name: p\n    limit: 1/s\n", "# nothing\n"},
		{"policies:\n  - name: p\n    limit: 1/s\n", ""},
		{"", ""},
		{"policies:\n  - name: p\n    limit: 1/s\n", "policies:\n  - name: p\n\tlimit: [\n"},
		{"a: &x 1\n", "b: *x\n"},
		{"policies:\r  - name: p\r    limit: 1/s\r", "policies:\r\n  - name: p\r\n    limit: 1/s\r\n"},
		{"domain: sluice.override\n", "policies:\n  - name: sluice.override\n    limit: 1/s\n"},
		{"---\npolicies: []\n---\npolicies:\n  - name: p\n    limit: 1/s\n", "---\n---\n"},
	} {
		f.Add([]byte(p[0]), []byte(p[1]))
	}
	dir := f.TempDir()
	aName, bName := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yml")
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if err := os.WriteFile(aName, a, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bName, b, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(dir)
		again, errAgain := Load(dir)
		if err != nil {
			checkFilesError(t, map[string][]byte{aName: a, bName: b}, err)
			if errAgain == nil || errAgain.Error() != err.Error() {
				t.Fatalf("two loads differ:\n%v\n%v", err, errAgain)
			}
			// a.yaml's problems come first, as they are alone.
			if _, aErr := Parse(aName, a); aErr != nil && !strings.HasPrefix(err.Error(), aErr.Error()) {
				t.Fatalf("a.yaml alone: %v\nwith b.yml: %v", aErr, err)
			}
			return
		}
		if errAgain != nil {
			t.Fatalf("loads once, then: %v", errAgain)
		}
		if !slices.Equal(cfg.Files, []string{aName, bName}) || !slices.Equal(again.Files, cfg.Files) {
			t.Fatalf("files %q, then %q; want %q", cfg.Files, again.Files, []string{aName, bName})
		}
		var first, second strings.Builder
		cfg.Describe(&first)
		again.Describe(&second)
		if first.String() != second.String() {
			t.Fatalf("two loads differ:\n%s\n%s", first.String(), second.String())
		}
	})
}
