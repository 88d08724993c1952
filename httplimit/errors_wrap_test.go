package httplimit_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/httplimit"
)

// Every construction error wraps the package's ErrInvalidConfig.
func TestConstructorErrorsWrapErrInvalidConfig(t *testing.T) {
	if _, err := httplimit.ClientIP(&httplimit.IPOptions{TrustedProxies: []string{"10.0.0.0/33"}}); !errors.Is(err, httplimit.ErrInvalidConfig) {
		t.Errorf("httplimit.ClientIP(bad CIDR): %v", err)
	}
	if _, err := httplimit.ClientIP(&httplimit.IPOptions{Header: "X-Real-IP"}); !errors.Is(err, httplimit.ErrInvalidConfig) {
		t.Errorf("httplimit.ClientIP(bad header): %v", err)
	}
	if _, err := grpclimit.ClientIP(&grpclimit.IPOptions{TrustedProxies: []string{"bad"}}); !errors.Is(err, grpclimit.ErrInvalidConfig) {
		t.Errorf("grpclimit.ClientIP(bad CIDR): %v", err)
	}
	if _, err := httplimit.ParseStrategy("nope"); !errors.Is(err, httplimit.ErrInvalidConfig) {
		t.Errorf("httplimit.ParseStrategy: %v", err)
	}
}

// A bad client IP configuration says "httplimit:" once, not per wrapping.
func TestClientIPErrorPrefixOnce(t *testing.T) {
	_, err := httplimit.ClientIP(&httplimit.IPOptions{IPv4Prefix: 40})
	if !errors.Is(err, httplimit.ErrInvalidConfig) || strings.Count(err.Error(), "httplimit:") != 1 || !strings.Contains(err.Error(), "IPv4 prefix /40") {
		t.Fatalf("err = %v, want ErrInvalidConfig naming the prefix, with one httplimit: prefix", err)
	}
}
