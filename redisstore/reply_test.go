package redisstore

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestParseResult(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    []int64
		want int
		ok   bool
	}{
		{"four", []int64{1, 4, 0, 6000}, 4, true},
		{"five", []int64{0, 0, 5, 6, 99}, 5, true},
		{"nil", nil, 4, false},
		{"empty", []int64{}, 4, false},
		{"short", []int64{1, 4}, 4, false},
		{"long", []int64{1, 4, 0, 6, 9}, 4, false},
		{"allowed 2", []int64{2, 4, 0, 6}, 4, false},
		{"allowed -1", []int64{-1, 4, 0, 6}, 4, false},
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
	if r, _ := parseResult([]int64{1, 4, 0, 6000, 7}, 5); r != (result{allowed: true, remaining: 4, reset: 6000, token: 7}) {
		t.Errorf("parseResult = %+v", r)
	}
	if r, _ := parseResult([]int64{0, 0, 5, 6}, 4); r != (result{retry: 5, reset: 6}) {
		t.Errorf("parseResult = %+v", r)
	}
}

func TestParseAll(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    []int64
		n    int
		ok   bool
	}{
		{"two", []int64{1, 0, 0, 6, 0, 1, 5, 6}, 2, true},
		{"missing request", []int64{1, 0, 0, 6}, 2, false},
		{"ragged", []int64{1, 0, 0, 6, 0, 1, 5}, 2, false},
		{"bad request", []int64{1, 0, 0, 6, 3, 1, 5, 6}, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := parseAll(tc.v, tc.n)
			if !tc.ok {
				if !errors.Is(err, ErrUnexpectedReply) {
					t.Fatalf("parseAll: %v, want ErrUnexpectedReply", err)
				}
				return
			}
			if err != nil || len(rs) != tc.n || rs[1].retry != 5 || rs[1].reset != 6 || !rs[0].allowed {
				t.Fatalf("parseAll = %+v %v", rs, err)
			}
		})
	}
}

// TestReplyErr: a reply that is not an array of integers, read by the
// command type every script call uses, is ErrUnexpectedReply; a server error
// is not.
func TestReplyErr(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	key := redistest.Prefix(t) + "k"
	t.Cleanup(func() { c.Del(context.Background(), key) })
	for _, tc := range []struct {
		name       string
		args       []any
		unexpected bool
	}{
		{"string", []any{"eval", "return 'x'", "1", key}, true},
		{"array of strings", []any{"eval", "return {'x', 'y'}", "1", key}, true},
		{"nested array", []any{"eval", "return {1, {2}}", "1", key}, true},
		{"script error", []any{"eval", "return redis.error_reply('ERR boom')", "1", key}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := newCmd(ctx, nil, tc.args)
			err := c.Process(ctx, cmd)
			if err == nil {
				t.Fatalf("no error, reply %v", cmd.Val())
			}
			if got := errors.Is(replyErr(err), ErrUnexpectedReply); got != tc.unexpected {
				t.Errorf("replyErr(%v) is ErrUnexpectedReply: %v, want %v", err, got, tc.unexpected)
			}
		})
	}
}
