package enum

import "testing"

type color uint8

var colorNames = []string{"red", "green"}

func TestStringParse(t *testing.T) {
	t.Parallel()
	for i, name := range colorNames {
		if got := String(colorNames, color(i), "color"); got != name {
			t.Errorf("String(%d) = %q, want %q", i, got, name)
		}
		if got, ok := Parse[color](colorNames, name); !ok || got != color(i) {
			t.Errorf("Parse(%q) = %d, %v", name, got, ok)
		}
	}
	if got := String(colorNames, color(7), "color"); got != "color(7)" {
		t.Errorf("String(7) = %q", got)
	}
	if _, ok := Parse[color](colorNames, "blue"); ok {
		t.Error(`Parse("blue") ok`)
	}
}
