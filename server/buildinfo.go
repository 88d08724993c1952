package server

import (
	"cmp"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// BuildInfo says which sluice is running, as the Go toolchain recorded it
// in the binary.
type BuildInfo struct {
	// Version is the module version: "v1.2.3" when installed with
	// go install …@v1.2.3, "(devel)" when built from a checkout, "" when
	// the binary carries no build information (a test binary).
	Version string
	// Revision is the VCS revision the binary was built from; empty when
	// not recorded (go install of a tagged version, or -buildvcs=false).
	Revision string
	// Modified: the checkout had uncommitted changes.
	Modified bool
	// GoVersion is the toolchain, e.g. "go1.26.0".
	GoVersion string
}

// ReadBuildInfo returns the running binary's BuildInfo.
func ReadBuildInfo() BuildInfo {
	b := BuildInfo{GoVersion: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	b.Version = info.Main.Version
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// String is what `sluice version` prints, e.g.
// "sluice (devel) revision 1a2b3c… (modified) go1.26.0".
func (b BuildInfo) String() string {
	s := "sluice " + cmp.Or(b.Version, "(unknown)")
	if b.Revision != "" {
		s += " revision " + b.Revision
		if b.Modified {
			s += " (modified)"
		}
	}
	return fmt.Sprintf("%s %s", s, b.GoVersion)
}

// collector is the constant sluice_build_info series.
func (b BuildInfo) collector() prometheus.Collector {
	rev := b.Revision
	if b.Modified {
		rev += "-modified"
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_build_info",
		Help: "Always 1; the labels say which build is running (version, revision, goversion).",
		ConstLabels: prometheus.Labels{
			"version": b.Version, "revision": rev, "goversion": b.GoVersion,
		},
	}, func() float64 { return 1 })
}
