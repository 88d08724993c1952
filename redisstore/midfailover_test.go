package redisstore

import "testing"

// A slot map read mid-failover lists the old masters and the promoted
// replica: not told until the old master has no slots left.
func TestMidFailover(t *testing.T) {
	for _, tt := range []struct {
		last  string
		addrs []string
		want  bool
	}{
		{"a:1,b:1,c:1", []string{"a:1", "b:1", "c:1", "d:1"}, true},
		{"a:1,b:1,c:1", []string{"a:1", "b:1", "d:1"}, false},
		{"a:1,b:1,c:1", []string{"a:1", "b:1", "c:1"}, false},
		{"a:1,b:1", []string{"a:1", "c:1", "d:1"}, false},
	} {
		if got := midFailover(tt.last, tt.addrs); got != tt.want {
			t.Errorf("midFailover(%q, %q) = %v, want %v", tt.last, tt.addrs, got, tt.want)
		}
	}
}
