package server

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// git runs git in dir and returns its trimmed output; without git or a
// repository the test skips (a source archive), except under CI.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).Output()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("git %v: %v", args, err)
		}
		t.Skipf("git %v: %v (not a checkout?)", args, err)
	}
	return strings.TrimSpace(string(out))
}

// TestCLIVersionFromCheckout: a binary built from a checkout names the
// checkout's revision, in `sluice version`, in `--version`, in the startup
// line and in sluice_build_info. The checkout is a fresh clone of this
// one's HEAD, so the revision is known and nothing is modified. Its module
// version is "(devel)", or since Go 1.24 a pseudo-version the toolchain
// derives from the same commit (v0.0.0-20261123162359-5b68b78407d6).
func TestCLIVersionFromCheckout(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command")
	}
	root := git(t, "..", "rev-parse", "--show-toplevel")
	src := filepath.Join(t.TempDir(), "sluice")
	git(t, root, "clone", "-q", "--shared", root, src)
	rev := git(t, src, "rev-parse", "HEAD")
	bin := filepath.Join(t.TempDir(), "sluice")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./cmd/sluice")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	p := &proc{cmd: exec.Command(bin, "serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")}
	p.start(t)
	version := p.started["version"]
	if version != "(devel)" && !(strings.HasPrefix(version, "v0.0.0-") && strings.HasSuffix(version, "-"+rev[:12])) {
		t.Errorf("version %q: want (devel) or a pseudo-version of %s", version, rev)
	}
	if got := p.started["revision"]; got != rev {
		t.Errorf("startup line: revision %q, want %s", got, rev)
	}
	want := "sluice " + version + " revision " + rev + " " + runtime.Version()
	for _, arg := range []string{"version", "--version"} {
		out, err := exec.Command(bin, arg).Output()
		if err != nil {
			t.Fatalf("sluice %s: %v", arg, err)
		}
		if got := strings.TrimSpace(string(out)); got != want {
			t.Errorf("sluice %s = %q, want %q", arg, got, want)
		}
	}
	_, metrics := p.get(t, "/metrics")
	series := `sluice_build_info{goversion="` + runtime.Version() + `",revision="` + rev + `",version="` + version + `"} 1`
	if !strings.Contains(metrics, series) {
		t.Errorf("metrics lack %s", series)
	}
	p.stop(t)
}
