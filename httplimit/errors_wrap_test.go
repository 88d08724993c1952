package httplimit_test

import (
	"errors"
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
