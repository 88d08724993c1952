package redisstore

import (
	"fmt"
	"time"

	"sluice"
)

// result is one decision as a script returns it, in microseconds.
type result struct {
	allowed   bool
	remaining int64
	retry     int64
	reset     int64
	now       int64 // the time the script decided at
	token     int64 // what a refund needs (sliding_window_log: last sequence number)
}

func (r result) decision(l sluice.Limit) sluice.Decision {
	return sluice.Decision{
		Allowed:    r.allowed,
		Limit:      l,
		Remaining:  max(r.remaining, 0),
		RetryAfter: time.Duration(max(r.retry, 0)) * time.Microsecond,
		ResetAfter: time.Duration(max(r.reset, 0)) * time.Microsecond,
	}
}

// parseResult reads take_one's reply {allowed, remaining, retry, reset, now,
// token}, or take_all's per-request {allowed, remaining, retry, reset}
// (want 4). Any other shape is ErrUnexpectedReply.
func parseResult(v any, want int) (result, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) != want {
		return result{}, fmt.Errorf("%w: want an array of %d integers, got %T %v", ErrUnexpectedReply, want, v, v)
	}
	var n [6]int64
	for i, e := range arr {
		x, ok := e.(int64)
		if !ok {
			return result{}, fmt.Errorf("%w: element %d is %T %v, want an integer", ErrUnexpectedReply, i, e, e)
		}
		n[i] = x
	}
	if n[0] != 0 && n[0] != 1 {
		return result{}, fmt.Errorf("%w: allowed is %d, want 0 or 1", ErrUnexpectedReply, n[0])
	}
	return result{allowed: n[0] == 1, remaining: n[1], retry: n[2], reset: n[3], now: n[4], token: n[5]}, nil
}

// parseAll reads take_all's reply {now, {…} per request} for n requests.
func parseAll(v any, n int) (now int64, rs []result, err error) {
	arr, ok := v.([]any)
	if !ok || len(arr) != n+1 {
		return 0, nil, fmt.Errorf("%w: want an array of %d elements, got %T %v", ErrUnexpectedReply, n+1, v, v)
	}
	if now, ok = arr[0].(int64); !ok {
		return 0, nil, fmt.Errorf("%w: now is %T %v, want an integer", ErrUnexpectedReply, arr[0], arr[0])
	}
	rs = make([]result, n)
	for i := range rs {
		if rs[i], err = parseResult(arr[i+1], 4); err != nil {
			return 0, nil, fmt.Errorf("request %d: %w", i, err)
		}
		rs[i].now = now
	}
	return now, rs, nil
}
