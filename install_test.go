package sluice_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstallable: a module of its own, outside this tree, depends on the
// library through its published path github.com/sluicehq/sluice (a
// replace directive points at this checkout, as a fetched copy would
// serve) and builds, and so does the command by its full path, as
// `go install github.com/sluicehq/sluice/cmd/sluice@latest` builds it.
// GOFLAGS and GOPROXY come from the environment, so the module cache
// serves offline.
func TestInstallable(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module example.com/app\n\ngo 1.26.0\n\n" +
		"require github.com/sluicehq/sluice v0.0.0\n\n" +
		"replace github.com/sluicehq/sluice => " + root + "\n"
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	const main = `package main

import (
	"context"
	"fmt"
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
)

func main() {
	_ = redisstore.New(redis.NewClient(&redis.Options{Addr: "localhost:6379"}), nil)
	store := memory.New(nil)
	defer store.Close()
	limiter, err := sluice.NewLimiter(store, sluice.PerSecond(2), nil)
	if err != nil {
		panic(err)
	}
	for range 3 {
		d, _ := limiter.Allow(context.Background(), "k")
		fmt.Println(d.Allowed)
	}
	_, _ = httplimit.New(store, []httplimit.Rule{{Name: "api", Limit: sluice.PerSecond(1), Key: httplimit.Global()}}, nil)
	_ = http.NotFoundHandler()
}
`
	for name, body := range map[string]string{"go.mod": gomod, "go.sum": string(sum), "main.go": main} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"), "GOWORK=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("go", "build", "-o", filepath.Join(dir, "app"), ".")
	if got, want := run(filepath.Join(dir, "app")), "true\ntrue\nfalse\n"; got != want {
		t.Errorf("app printed %q, want %q", got, want)
	}
	run("go", "build", "-o", filepath.Join(dir, "sluice"), "github.com/sluicehq/sluice/cmd/sluice")
	if got := run(filepath.Join(dir, "sluice"), "version"); !strings.HasPrefix(got, "sluice ") {
		t.Errorf("sluice version printed %q", got)
	}
}
