package sluice_test

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
)

// CheckBuilt tells a store never built from one made by its constructor,
// without calling it.
func TestCheckBuilt(t *testing.T) {
	t.Parallel()
	m := middlewaretest.Memory(t)
	for name, s := range map[string]sluice.Store{
		"nil":                   nil,
		"nil *memory.Store":     (*memory.Store)(nil),
		"zero memory.Store":     &memory.Store{},
		"zero redisstore.Store": &redisstore.Store{},
		"redisstore.New(nil)":   redisstore.New(nil, nil),
		"zero lease.Store":      &lease.Store{},
		"nil *lease.Store":      (*lease.Store)(nil),
	} {
		if err := sluice.CheckBuilt(s); !errors.Is(err, sluice.ErrStoreNotBuilt) {
			t.Errorf("CheckBuilt(%s) = %v, want ErrStoreNotBuilt", name, err)
		}
		if s == nil {
			continue
		}
		// NewLimiter refuses it up front: it would fail every call.
		if _, err := sluice.NewLimiter(s, sluice.PerSecond(1), nil); !errors.Is(err, sluice.ErrStoreNotBuilt) {
			t.Errorf("NewLimiter(%s) = %v, want ErrStoreNotBuilt", name, err)
		}
	}
	if err := sluice.CheckBuilt(m); err != nil {
		t.Errorf("CheckBuilt(memory.New) = %v", err)
	}
}

// BuildChecker's doc names every type of the module that implements it, so
// that a reader knows which constructors can refuse an unbuilt value.
func TestBuildCheckerDocNamesImplementers(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	var doc string
	var impls []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "internal") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					if ts, ok := spec.(*ast.TypeSpec); ok && ts.Name.Name == "BuildChecker" && f.Name.Name == "sluice" {
						doc = decl.Doc.Text()
					}
				}
			case *ast.FuncDecl:
				if decl.Recv == nil || decl.Name.Name != "CheckBuilt" || f.Name.Name == "main" {
					continue
				}
				recv := decl.Recv.List[0].Type
				if star, ok := recv.(*ast.StarExpr); ok {
					recv = star.X
				}
				if id, ok := recv.(*ast.Ident); ok && id.IsExported() { // a reader cannot name an unexported one
					impls = append(impls, f.Name.Name+"."+id.Name)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if doc == "" || len(impls) == 0 {
		t.Fatalf("found no BuildChecker doc (%q) or no implementers (%v)", doc, impls)
	}
	doc = strings.Join(strings.Fields(doc), " ")
	for _, name := range impls {
		if !strings.Contains(doc, name) {
			t.Errorf("BuildChecker's doc does not name %s, which implements it:\n%s", name, doc)
		}
	}
}
