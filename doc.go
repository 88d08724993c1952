// Package sluice is distributed rate limiting: one shared limit per client
// across a fleet of servers, decided atomically on Redis (package
// redisstore) or exactly in process (package memory).
//
// A Limit is a rate over a period under one of six algorithms — GCRA (the
// default), token bucket, leaky bucket, fixed window, sliding window log and
// sliding window counter — with an optional burst:
//
//	limit := sluice.PerMinute(100).WithBurst(20)
//	limit, err := sluice.ParseLimit("sliding_window_log 5/15m")
//
// A Store decides: Take takes units (a weighted cost) if the limit allows,
// Peek looks without taking, Reset forgets a key. Every Decision says
// whether the units were taken, how many remain, the exact wait before the
// same request would be admitted (RetryAfter) and until the key is fresh
// again (ResetAfter). A MultiStore also takes several limits
// all-or-nothing, for layered limits. A Limiter binds a store to one limit,
// with Allow, Peek, Reset and Wait:
//
//	lim, err := sluice.NewLimiter(memory.New(nil), sluice.PerSecond(10), nil)
//	d, err := lim.Allow(ctx, clientIP)
//	if !d.Allowed {
//		// reject; retry after d.RetryAfter
//	}
//
// Bad input (an empty or over-long key, an invalid limit, a cost of zero or
// less, or one the limit can never admit) returns an error wrapping
// ErrInvalidKey, ErrInvalidLimit, ErrInvalidCost or ErrCostExceedsBurst and
// changes nothing. This package imports only the
// standard library; the HTTP and gRPC middleware (httplimit, grpclimit),
// failure policies for a Redis outage (resilient) and Prometheus metrics
// (promsluice) build on it.
package sluice
