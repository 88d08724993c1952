// Package enum names the small enumerations of the middleware, the
// failure policy and the service (strategies, header sets, failure
// policies) from one table of names each.
package enum

import "strconv"

// String returns names[v], or typ(v), such as "Policy(7)", for a value
// past the table.
func String[T ~uint8](names []string, v T, typ string) string {
	if int(v) < len(names) {
		return names[v]
	}
	return typ + "(" + strconv.Itoa(int(v)) + ")"
}

// Unmarshal sets *dst to parse(text), leaving it as it was on an error:
// the body of an UnmarshalText.
func Unmarshal[T any](text []byte, parse func(string) (T, error), dst *T) error {
	v, err := parse(string(text))
	if err != nil {
		return err
	}
	*dst = v
	return nil
}

// Parse returns the value named name in the table.
func Parse[T ~uint8](names []string, name string) (T, bool) {
	for i, n := range names {
		if n == name {
			return T(i), true
		}
	}
	return 0, false
}
