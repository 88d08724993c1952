package race

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// runWithoutRace is what scripts/test runs again without -race: the fault
// and fleet step's -run pattern and the waiting-line step's.
var runWithoutRace = regexp.MustCompile(`Fault|Fleet|OpenLoop|AtOnce`)

// A test that calls SkipTiming skips in the race-enabled run; unless its
// name is one scripts/test runs again without -race, CI never runs it.
func TestSkipTimingTestsRunWithoutRace(t *testing.T) {
	script, err := os.ReadFile("../../scripts/test")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"'Fault|Fleet'", "'OpenLoop|AtOnce'"} {
		if !strings.Contains(string(script), p) {
			t.Fatalf("scripts/test no longer runs -run %s: update runWithoutRace", p)
		}
	}
	fset := token.NewFileSet()
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "../.." && (strings.HasPrefix(d.Name(), ".") || fileExists(filepath.Join(path, "go.mod"))) {
			return filepath.SkipDir // another module: its own CI step
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Body == nil {
				continue
			}
			if callsSkipTiming(fn.Body) && !runWithoutRace.MatchString(fn.Name.Name) {
				t.Errorf("%s: %s calls race.SkipTiming but no step of scripts/test runs it without -race: name it Test…Fault… (or match %s)",
					fset.Position(fn.Pos()), fn.Name.Name, runWithoutRace)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func callsSkipTiming(body *ast.BlockStmt) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "SkipTiming" {
			found = true
		}
		return !found
	})
	return found
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
