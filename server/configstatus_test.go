package server

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// statusConfig is /v1/status's config object as a client reads it.
type statusConfig struct {
	Version  uint64
	LoadedAt time.Time `json:"loaded_at"`
	Rejected *struct {
		At, Since time.Time
		Error     string
		Errors    []struct {
			File         string
			Line, Column int
			Message      string
		}
	}
}

// serveStatus is `sluice serve`'s /v1/status, with its config object.
func serveStatus(t *testing.T, p *proc) (ready, degraded bool, reasons []string, cfg *statusConfig) {
	t.Helper()
	code, body := p.get(t, "/v1/status")
	var st struct {
		Ready, Degraded bool
		Reasons         []string
		Config          *statusConfig
	}
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
		t.Fatalf("/v1/status: %d %v: %s", code, err, body)
	}
	if st.Config == nil {
		t.Fatalf("/v1/status has no config: %s", body)
	}
	return st.Ready, st.Degraded, st.Reasons, st.Config
}

// TestServeConfigRejectedInStatus: a rejected reload shows in /v1/status
// (the error with file:line:column, when) while the configuration in force
// keeps its version and load time; the instance stays ready and not
// degraded; the next good reload clears it.
func TestServeConfigRejectedInStatus(t *testing.T) {
	file := writeConfig(t, "policies:\n  - name: a\n    limit: 5/min\n")
	p := startSluice(t, nil, "--config", file, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0")
	_, _, _, first := serveStatus(t, p)
	if first.Version == 0 || first.LoadedAt.IsZero() || first.Rejected != nil {
		t.Fatalf("at start: config %+v, want a version, a load time and no rejection", first)
	}

	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("policies:\n  - name: a\n    limit: 5/fortnight\n")
	before := time.Now()
	p.signal(t, syscall.SIGHUP)
	p.expect(t, "config reload rejected; keeping the configuration in force")
	ready, degraded, reasons, cfg := serveStatus(t, p)
	if !ready || degraded || len(reasons) != 0 {
		t.Errorf("after a rejected reload: ready %v, degraded %v, reasons %q; want ready, not degraded: the configuration in force runs", ready, degraded, reasons)
	}
	if cfg.Version != first.Version || !cfg.LoadedAt.Equal(first.LoadedAt) {
		t.Errorf("after a rejected reload: version %d loaded %v, want the one in force: %d loaded %v", cfg.Version, cfg.LoadedAt, first.Version, first.LoadedAt)
	}
	r := cfg.Rejected
	if r == nil {
		t.Fatal("after a rejected reload: no rejection in /v1/status")
	}
	if !strings.Contains(r.Error, file+":3:12: ") || !strings.Contains(r.Error, "fortnight") {
		t.Errorf("rejection error %q, want file:line:column naming the bad unit", r.Error)
	}
	if len(r.Errors) != 1 || r.Errors[0].File != file || r.Errors[0].Line != 3 || r.Errors[0].Column != 12 || !strings.Contains(r.Errors[0].Message, "fortnight") {
		t.Errorf("rejection errors %+v, want one at %s:3:12", r.Errors, file)
	}
	if r.At.Before(before.Add(-time.Second)) || r.At.After(time.Now()) || !r.Since.Equal(r.At) {
		t.Errorf("rejected at %v since %v, want between %v and now, since then", r.At, r.Since, before)
	}
	if code, body := p.get(t, "/readyz"); code != 200 || body != "ok\n" {
		t.Errorf("/readyz after a rejected reload: %d %q, want 200 ok", code, body)
	}

	// A second rejection keeps when the first was.
	write("policies:\n  - name: a\n    limit: 5/min\n    colour: blue\n")
	p.signal(t, syscall.SIGHUP)
	p.expect(t, "config reload rejected; keeping the configuration in force")
	_, _, _, cfg = serveStatus(t, p)
	if cfg.Rejected == nil || !cfg.Rejected.Since.Equal(r.Since) || cfg.Rejected.At.Before(r.At) || !strings.Contains(cfg.Rejected.Error, file+":4:5: ") {
		t.Errorf("after a second rejection: %+v, want its own error and at, since the first's %v", cfg.Rejected, r.Since)
	}

	write("policies:\n  - name: a\n    limit: 7/min\n")
	p.signal(t, syscall.SIGHUP)
	p.expect(t, "config reloaded")
	_, _, _, cfg = serveStatus(t, p)
	if cfg.Rejected != nil || cfg.Version <= first.Version || cfg.LoadedAt.Before(r.At) {
		t.Errorf("after a good reload: %+v, want no rejection, a newer version and load time", cfg)
	}
	p.stop(t)
}

// TestServiceConfigRejection: a rejection that is not a positioned config
// error (a file gone, no policies) is one problem of the file; SetConfig
// clears it.
func TestServiceConfigRejection(t *testing.T) {
	svc := newMemService(t, "policies:\n  - name: a\n    limit: 5/min\n", newFakeClock())
	svc.rejectConfig("/etc/sluice.yaml", errors.Join(ErrNoPolicies))
	st := svc.ConfigStatus()
	if st.Rejected == nil || len(st.Rejected.Errors) != 1 || st.Rejected.Errors[0].File != "/etc/sluice.yaml" ||
		st.Rejected.Errors[0].Line != 0 || st.Rejected.Errors[0].Message != ErrNoPolicies.Error() {
		t.Errorf("rejection %+v, want one problem of the file", st.Rejected)
	}
	svc.SetConfig(svc.Config())
	if st := svc.ConfigStatus(); st.Rejected != nil {
		t.Errorf("after SetConfig: %+v, want no rejection", st.Rejected)
	}
	if st := (&Service{}).ConfigStatus(); st.Version != 0 || st.Rejected != nil {
		t.Errorf("zero Service: %+v", st)
	}
}
