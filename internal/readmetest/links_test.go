package readmetest

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// docFiles are README.md and docs/*.md, relative to the repository's root.
func docFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, "docs/"+filepath.Base(d))
	}
	return files
}

// anchor is GitHub's id for a heading: lower case, spaces to '-', every
// other character but letters, digits, '-' and '_' dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var (
	headingLine = regexp.MustCompile(`^#{1,6} (.+)$`)
	codeSpan    = regexp.MustCompile("`[^`]*`")
	link        = regexp.MustCompile(`\]\(([^)\s]+)\)`)
)

// outsideCode calls f with each line of a Markdown text that is not in a
// fenced block, its code spans blanked, and the line's number.
func outsideCode(text string, f func(line string, n int)) {
	fenced := false
	for i, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			f(codeSpan.ReplaceAllString(l, "``"), i+1)
		}
	}
}

// anchors are the ids of a Markdown file's headings, a repeated one
// numbered as GitHub numbers it (-1, -2, …).
func anchors(text string) map[string]bool {
	ids, seen := map[string]bool{}, map[string]int{}
	fenced := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		m := headingLine.FindStringSubmatch(l)
		if fenced || m == nil {
			continue
		}
		id := anchor(strings.ReplaceAll(m[1], "`", ""))
		if n := seen[id]; n > 0 {
			seen[id]++
			id = fmt.Sprintf("%s-%d", id, n)
		} else {
			seen[id] = 1
		}
		ids[id] = true
	}
	return ids
}

func TestAnchor(t *testing.T) {
	for heading, want := range map[string]string{
		"The service: `sluice serve`":              "the-service-sluice-serve",
		"envoyproxy/ratelimit's format, unchanged": "envoyproxyratelimits-format-unchanged",
		"Client addresses: `ipv6_prefix`":          "client-addresses-ipv6_prefix",
		"Outbound: calling a rate-limited API":     "outbound-calling-a-rate-limited-api",
	} {
		if got := anchor(strings.ReplaceAll(heading, "`", "")); got != want {
			t.Errorf("anchor(%q) = %q, want %q", heading, got, want)
		}
	}
}

// TestLinks: every relative link in README.md, docs/*.md, CHANGELOG.md and
// BENCHMARKS.md names a file of the repository, and every #anchor a
// heading of the file it names.
func TestLinks(t *testing.T) {
	files := append(docFiles(t), "CHANGELOG.md", "BENCHMARKS.md")
	texts := map[string]string{}
	read := func(file string) (string, bool) {
		if s, ok := texts[file]; ok {
			return s, true
		}
		b, err := os.ReadFile(filepath.Join("../..", file))
		if err != nil {
			return "", false
		}
		texts[file] = string(b)
		return string(b), true
	}
	checked := 0
	for _, file := range files {
		text, ok := read(file)
		if !ok {
			t.Fatalf("%s: cannot read", file)
		}
		outsideCode(text, func(line string, n int) {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				p, frag, _ := strings.Cut(target, "#")
				to := file
				if p != "" {
					to = path.Clean(path.Join(path.Dir(file), p))
					if strings.HasPrefix(to, "../") {
						t.Errorf("%s:%d: %s leaves the repository", file, n, target)
						continue
					}
					if _, err := os.Stat(filepath.Join("../..", to)); err != nil {
						t.Errorf("%s:%d: %s: no such file %s", file, n, target, to)
						continue
					}
				}
				if frag == "" {
					continue
				}
				if !strings.HasSuffix(to, ".md") {
					t.Errorf("%s:%d: %s: an anchor into a file that is not Markdown", file, n, target)
					continue
				}
				dest, _ := read(to)
				if !anchors(dest)[frag] {
					t.Errorf("%s:%d: %s: %s has no heading #%s", file, n, target, to, frag)
				}
			}
		})
	}
	if checked == 0 {
		t.Fatal("no relative links found")
	}
	t.Logf("%d relative links checked in %d files", checked, len(files))
}
