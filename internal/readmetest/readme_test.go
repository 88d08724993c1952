// Package readmetest proves that every Go example in README.md and
// docs/*.md compiles, that every fragment runs without panicking, and that
// every relative link and anchor between them resolves.
package readmetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// An example is either a whole program (it starts with a package
// clause), built as it is, or a fragment: statements, optionally after an
// import block. A fragment runs inside
//
//	func snippetN(ctx context.Context, apiKey string, store *memory.Store) error { { FRAGMENT } ... }
//
// so it may use ctx, apiKey and store (and return an error) as the
// prose assumes; a fragment without imports gets those of the
// packages it names (see packages).
var packages = map[string]string{
	"context":    "context",
	"http":       "net/http",
	"time":       "time",
	"redis":      "github.com/redis/go-redis/v9",
	"sluice":     "github.com/sluicehq/sluice",
	"memory":     "github.com/sluicehq/sluice/memory",
	"redisstore": "github.com/sluicehq/sluice/redisstore",
	"resilient":  "github.com/sluicehq/sluice/resilient",
	"httplimit":  "github.com/sluicehq/sluice/httplimit",
	"grpclimit":  "github.com/sluicehq/sluice/grpclimit",
	"promsluice": "github.com/sluicehq/sluice/promsluice",
}

type snippet struct {
	file string // relative to the repository's root
	line int    // of the opening fence
	src  string
}

func goSnippets(t *testing.T, file, readme string) []snippet {
	t.Helper()
	var out []snippet
	lines := strings.Split(readme, "\n")
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != "```go" {
			continue
		}
		start := i
		var b strings.Builder
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			b.WriteString(lines[i])
			b.WriteByte('\n')
		}
		out = append(out, snippet{file: file, line: start + 1, src: b.String()})
	}
	return out
}

var importBlock = regexp.MustCompile(`(?s)^\s*import \((.*?)\)\n`)

// fragment returns the Go file that holds fragment n as a function.
func fragment(t *testing.T, n int, s snippet) string {
	t.Helper()
	body, imports := s.src, ""
	if m := importBlock.FindStringSubmatchIndex(body); m != nil {
		imports = body[m[2]:m[3]]
		body = body[m[1]:]
	} else {
		for name, path := range packages {
			if regexp.MustCompile(`\b` + name + `\.`).MatchString(body) {
				imports += fmt.Sprintf("\t%q\n", path)
			}
		}
	}
	// Variables the fragment declares are used once more, so that an
	// example that only shows a value compiles.
	var uses strings.Builder
	f, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc f() {\n"+body+"\n}\n", 0)
	if err != nil {
		t.Fatalf("%s:%d: %v\n%s", s.file, s.line, err, s.src)
	}
	for _, st := range f.Decls[0].(*ast.FuncDecl).Body.List {
		if as, ok := st.(*ast.AssignStmt); ok && as.Tok == token.DEFINE {
			for _, e := range as.Lhs {
				if id, ok := e.(*ast.Ident); ok && id.Name != "_" {
					fmt.Fprintf(&uses, "\t\t_ = %s\n", id.Name)
				}
			}
		}
	}
	return fmt.Sprintf(`package main

import (
	"context"

	"github.com/sluicehq/sluice/memory"
%s)

var _ = context.Background
var _ *memory.Store

// %s:%d
func snippet%d(ctx context.Context, apiKey string, store *memory.Store) error {
	{
%s
%s	}
	return nil
}
`, imports, s.file, s.line, n, body, uses.String())
}

func TestREADME(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the documentation's examples with the go command")
	}
	var snippets []snippet
	for _, file := range docFiles(t) {
		text, err := os.ReadFile(filepath.Join("../..", file))
		if err != nil {
			t.Fatal(err)
		}
		snippets = append(snippets, goSnippets(t, file, string(text))...)
	}
	if len(snippets) == 0 {
		t.Fatal("no Go examples found in README.md or docs/")
	}
	// The examples are built as packages of this module (so they import
	// it as users do): files in a temporary directory, laid over a
	// directory of this package that does not exist (go build -overlay).
	pkgDir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	overlay := map[string]string{}
	write := func(virtual, src string) {
		t.Helper()
		real := filepath.Join(tmp, fmt.Sprintf("%d.go", len(overlay)))
		if err := os.WriteFile(real, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		overlay[filepath.Join(pkgDir, "_snippets", virtual)] = real
	}
	var calls strings.Builder
	var programs []string
	for n, s := range snippets {
		if strings.HasPrefix(strings.TrimSpace(s.src), "package ") {
			p := fmt.Sprintf("program%d", n)
			write(p+"/main.go", s.src)
			programs = append(programs, p)
			continue
		}
		write(fmt.Sprintf("fragments/snippet%d.go", n), fragment(t, n, s))
		fmt.Fprintf(&calls, "\trun(\"%s:%d\", snippet%d)\n", s.file, s.line, n)
	}
	write("fragments/main.go", `package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/memory"
)

// run calls one fragment; an error (no Redis on the example's address,
// say) is fine, a panic is not.
func run(at string, f func(context.Context, string, *memory.Store) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	store := memory.New(nil)
	defer store.Close()
	fmt.Printf("%s: %v\n", at, f(ctx, "client-1", store))
}

func main() {
`+calls.String()+`}
`)
	js, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ov := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ov, js, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range programs {
		gocmd(t, "build", "-overlay", ov, "-o", os.DevNull, "./_snippets/"+p)
	}
	out := gocmd(t, "run", "-overlay", ov, "./_snippets/fragments")
	t.Logf("%d examples built, %d whole programs; fragments ran:\n%s", len(snippets), len(programs), out)
}

func gocmd(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}
