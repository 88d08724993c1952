package redisstore

import (
	"errors"
	"testing"
)

func TestParseResult(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    any
		want int
		ok   bool
	}{
		{"take_one", []any{int64(1), int64(4), int64(0), int64(6000), int64(99), int64(0)}, 6, true},
		{"take_all element", []any{int64(0), int64(0), int64(5), int64(6)}, 4, true},
		{"nil", nil, 6, false},
		{"string", "OK", 6, false},
		{"int", int64(1), 6, false},
		{"short", []any{int64(1), int64(4)}, 6, false},
		{"long", []any{int64(1), int64(4), int64(0), int64(6), int64(9), int64(0), int64(7)}, 6, false},
		{"string element", []any{int64(1), "4", int64(0), int64(6), int64(9), int64(0)}, 6, false},
		{"nil element", []any{int64(1), nil, int64(0), int64(6), int64(9), int64(0)}, 6, false},
		{"allowed 2", []any{int64(2), int64(4), int64(0), int64(6), int64(9), int64(0)}, 6, false},
		{"nested", []any{[]any{}, int64(4), int64(0), int64(6), int64(9), int64(0)}, 6, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseResult(tc.v, tc.want)
			if tc.ok && err != nil {
				t.Fatalf("parseResult: %v", err)
			}
			if !tc.ok && !errors.Is(err, ErrUnexpectedReply) {
				t.Fatalf("parseResult: %v, want ErrUnexpectedReply", err)
			}
		})
	}
	r, _ := parseResult([]any{int64(1), int64(4), int64(0), int64(6000), int64(99), int64(7)}, 6)
	if want := (result{allowed: true, remaining: 4, reset: 6000, now: 99, token: 7}); r != want {
		t.Errorf("parseResult = %+v, want %+v", r, want)
	}
}

func TestParseAll(t *testing.T) {
	good := []any{int64(1), int64(0), int64(5), int64(6)}
	for _, tc := range []struct {
		name string
		v    any
		n    int
		ok   bool
	}{
		{"two", []any{int64(42), good, good}, 2, true},
		{"not an array", "x", 2, false},
		{"missing request", []any{int64(42), good}, 2, false},
		{"now not an integer", []any{"42", good, good}, 2, false},
		{"bad request", []any{int64(42), good, []any{int64(1)}}, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now, rs, err := parseAll(tc.v, tc.n)
			if !tc.ok {
				if !errors.Is(err, ErrUnexpectedReply) {
					t.Fatalf("parseAll: %v, want ErrUnexpectedReply", err)
				}
				return
			}
			if err != nil || now != 42 || len(rs) != tc.n || rs[1].now != 42 || rs[1].reset != 6 {
				t.Fatalf("parseAll = %d %+v %v", now, rs, err)
			}
		})
	}
}
