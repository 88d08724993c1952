package httplimit_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/httplimit"
)

// A bad client IP configuration says "httplimit:" once, not per wrapping.
func TestClientIPErrorPrefixOnce(t *testing.T) {
	_, err := httplimit.ClientIP(&httplimit.IPOptions{IPv4Prefix: 40})
	if !errors.Is(err, httplimit.ErrInvalidConfig) || strings.Count(err.Error(), "httplimit:") != 1 || !strings.Contains(err.Error(), "IPv4 prefix /40") {
		t.Fatalf("err = %v, want ErrInvalidConfig naming the prefix, with one httplimit: prefix", err)
	}
}
