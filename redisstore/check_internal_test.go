package redisstore

import "testing"

// The version rule, as a table: only redis-server 7.0 and later are
// installed to test against, so an older server's refusal is proved here
// on its INFO value.
func TestVersionAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want bool
	}{
		{"7.0.0", true}, {"7.0.15", true}, {"7.2.4", true}, {"8.0.0", true}, {"10.0", true},
		{"6.2.14", false}, {"6.0", false}, {"5.0.7", false}, {"", false}, {"x.y", false}, {"7", true},
	} {
		if got := versionAtLeast(tc.v, MinVersion); got != tc.want {
			t.Errorf("versionAtLeast(%q, %q) = %v, want %v", tc.v, MinVersion, got, tc.want)
		}
	}
}
