package grpclimit_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/grpclimit"
)

// A bad client IP configuration says "grpclimit:" once, not per wrapping.
func TestClientIPErrorPrefixOnce(t *testing.T) {
	_, err := grpclimit.ClientIP(&grpclimit.IPOptions{TrustedProxies: []string{"not-a-cidr"}})
	if !errors.Is(err, grpclimit.ErrInvalidConfig) || strings.Count(err.Error(), "grpclimit:") != 1 || !strings.Contains(err.Error(), "not-a-cidr") {
		t.Fatalf("err = %v, want ErrInvalidConfig naming the proxy, with one grpclimit: prefix", err)
	}
}
