package redisstore

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
)

// result is one decision as a script returns it, in microseconds.
type result struct {
	allowed   bool
	remaining int64
	retry     int64
	reset     int64
	token     int64 // what a refund needs: the take's now (window algorithms) or last sequence number (log)
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

// parseResult reads a take/peek reply {allowed, remaining, retry, reset[,
// token]} of want integers. Any other shape is ErrUnexpectedReply.
func parseResult(v []int64, want int) (result, error) {
	if len(v) != want {
		return result{}, fmt.Errorf("%w: want %d integers, got %v", ErrUnexpectedReply, want, v)
	}
	if v[0] != 0 && v[0] != 1 {
		return result{}, fmt.Errorf("%w: allowed is %d, want 0 or 1", ErrUnexpectedReply, v[0])
	}
	r := result{allowed: v[0] == 1, remaining: v[1], retry: v[2], reset: v[3]}
	if want > 4 {
		r.token = v[4]
	}
	return r, nil
}

// parseAll reads take_all's reply: 4 integers per request, for n requests.
func parseAll(v []int64, n int) ([]result, error) {
	if len(v) != 4*n {
		return nil, fmt.Errorf("%w: want %d integers for %d requests, got %v", ErrUnexpectedReply, 4*n, n, v)
	}
	rs := make([]result, n)
	for i := range rs {
		r, err := parseResult(v[4*i:4*i+4], 4)
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		rs[i] = r
	}
	return rs, nil
}

// replyErr marks as ErrUnexpectedReply the client's failures to read a
// reply as an integer array (a script returning something else), and the
// server's refusals of a foreign value under a sluice key: WRONGTYPE (a
// key of another type), or a script's "corrupt state" (a value that is
// not the integer state sluice writes). A closed client's error
// (redis.ErrClosed) also matches sluice.ErrStoreClosed: no call will ever
// succeed, so background releases stop on it. Other server and network
// errors pass as they are.
func replyErr(err error) error {
	if errors.Is(err, redis.ErrClosed) {
		return closedErr(err)
	}
	var num *strconv.NumError
	if errors.As(err, &num) || strings.HasPrefix(err.Error(), "redis: can't parse") || foreign(err) {
		return fmt.Errorf("%w: %w", ErrUnexpectedReply, err)
	}
	return err
}

// closedErr is err, and sluice.ErrStoreClosed too if it is a closed
// client's (redis.ErrClosed).
func closedErr(err error) error {
	if errors.Is(err, redis.ErrClosed) && !errors.Is(err, sluice.ErrStoreClosed) {
		return fmt.Errorf("%w: %w", sluice.ErrStoreClosed, err)
	}
	return err
}

// foreign reports whether err is Redis refusing what it found under a key.
func foreign(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	return strings.HasPrefix(msg, "WRONGTYPE") || strings.Contains(msg, "sluice: corrupt")
}
