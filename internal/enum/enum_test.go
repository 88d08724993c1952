package enum

import (
	"errors"
	"testing"
)

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

func TestUnmarshal(t *testing.T) {
	t.Parallel()
	parse := func(s string) (color, error) {
		if c, ok := Parse[color](colorNames, s); ok {
			return c, nil
		}
		return 0, errors.New("no such color")
	}
	c := color(1)
	if err := Unmarshal([]byte("blue"), parse, &c); err == nil || c != 1 {
		t.Errorf(`Unmarshal("blue") = %d, %v; want 1 untouched and an error`, c, err)
	}
	if err := Unmarshal([]byte("red"), parse, &c); err != nil || c != 0 {
		t.Errorf(`Unmarshal("red") = %d, %v`, c, err)
	}
}
