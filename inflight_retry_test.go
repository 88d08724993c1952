package sluice_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/releasetest"
	"github.com/sluicehq/sluice/redisstore"
)

// failedRelease acquires a slot on a Redis that keeps it across a restart
// (appendfsync always), stops that Redis and fails the slot's release.
func failedRelease(t *testing.T) (*redistest.Server, *redis.Client, *redisstore.Store, sluice.InFlightLimit, *sluice.Slot) {
	t.Helper()
	ctx := context.Background()
	srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
	limit := sluice.Concurrent(1, 30*time.Second)
	slot, _, err := sluice.AcquireSlot(ctx, store, "k", limit, 1)
	if err != nil || slot == nil {
		t.Fatal(slot, err)
	}
	srv.Stop()
	if err := slot.Release(ctx); err == nil {
		t.Fatal("Release with Redis down: nil error")
	}
	return srv, client, store, limit, slot
}

// unreachable is a store on an address nothing listens on, tried once a
// call.
func unreachable(t *testing.T) *redisstore.Store {
	dead := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { dead.Close() })
	return redisstore.New(dead, &redisstore.Options{Prefix: redistest.Prefix(t)})
}

// A release that failed (Redis down) and is handed to RetryRelease frees
// the slot once Redis is back, and is not sent again after its answer.
func TestRetryReleaseFreesWhenBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, client, store, limit, slot := failedRelease(t)
	answers := make(chan bool, 2)
	if err := sluice.RetryRelease(store, "k", slot.Holder(), time.Now().Add(limit.Hold), func(held bool) { answers <- held }); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // a few tries fail
	srv.Start(t)
	select {
	case held := <-answers:
		if !held {
			t.Error("the release sent again found nothing held")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no answer 5s after Redis came back")
	}
	commands := func() int {
		info, err := client.Info(ctx, "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		_, v, _ := strings.Cut(info, "total_commands_processed:")
		n, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(v, "\n", 2)[0]))
		return n
	}
	before := commands()
	time.Sleep(time.Second)
	if n := commands() - before; n != 1 { // the first INFO
		t.Errorf("%d commands in the second after the answer, want none but INFO", n-1)
	}
	if len(answers) != 0 {
		t.Error("done called twice")
	}
	other, d, err := sluice.AcquireSlot(ctx, store, "k", limit, 1)
	if err != nil || other == nil {
		t.Fatalf("another holder after the retried release: %+v %v", d, err)
	}
	other.Release(ctx)
}

// Against a store that never answers, RetryRelease stops trying once
// until has passed, with no answer; bad input is refused.
func TestRetryReleaseGivesUp(t *testing.T) {
	t.Parallel()
	ln := redistest.Listen(t) // accepts and closes: every try fails
	var mu sync.Mutex
	var dials []time.Time
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			dials = append(dials, time.Now())
			mu.Unlock()
			c.Close()
		}
	}()
	client := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
	until := time.Now().Add(time.Second)
	answered := make(chan bool, 1)
	if err := sluice.RetryRelease(store, "k", sluice.NewHolderID(), until, func(held bool) { answered <- held }); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(until) + 3*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if len(dials) == 0 {
		t.Fatal("never tried")
	}
	if last := dials[len(dials)-1]; last.After(until) {
		t.Errorf("tried %v after until (%d tries)", last.Sub(until), len(dials))
	}
	if len(answered) != 0 {
		t.Error("done called without an answer")
	}
	for _, c := range []struct {
		store       sluice.Slots
		key, holder string
		want        []error
	}{
		{nil, "k", "h", []error{sluice.ErrInvalidLimit, sluice.ErrStoreNotBuilt}},
		{store, "", "h", []error{sluice.ErrInvalidKey}},
		{store, "k", "", []error{sluice.ErrInvalidHolder}},
	} {
		err := sluice.RetryRelease(c.store, c.key, c.holder, time.Now().Add(time.Minute), nil)
		for _, want := range c.want {
			if !errors.Is(err, want) {
				t.Errorf("RetryRelease(%v, %q, %q) = %v, want %v", c.store, c.key, c.holder, err, want)
			}
		}
	}
}

// At most MaxBackgroundReleases retried releases are at work at once: the
// next is ErrRetriesFull. Not parallel: it fills the process's bound.
func TestRetryReleaseBounded(t *testing.T) {
	store := releasetest.Unanswered(t) // every try waits out its deadline
	until := time.Now().Add(time.Second)
	for i := range sluice.MaxBackgroundReleases {
		if err := sluice.RetryRelease(store, "k", sluice.NewHolderID(), until, nil); err != nil {
			t.Fatalf("retry %d: %v", i, err)
		}
	}
	if err := sluice.RetryRelease(store, "k", sluice.NewHolderID(), until, nil); !errors.Is(err, sluice.ErrRetriesFull) {
		t.Fatalf("one retry more: %v, want ErrRetriesFull", err)
	}
	// Past until they give up, and the bound is free again.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := sluice.RetryRelease(store, "k", sluice.NewHolderID(), time.Now().Add(10*time.Millisecond), nil)
		if err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("10s after until: %v", err)
		}
	}
	time.Sleep(200 * time.Millisecond) // the probe's own retry ends
}

// A burst of abandoned acquires (a Redis stall under load times out
// dozens at once, most of which never ran) does not crowd out the release
// of one that ran: before, ReleaseAbandoned dropped all beyond 64 at work,
// each at work a second when nothing was held, and the slots of those
// dropped stayed held to their hold timeout.
func TestReleaseAbandonedBurst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := middlewaretest.Redis(t, nil)
	limit := sluice.Concurrent(1, 30*time.Second)
	ran := sluice.NewHolderID()
	if d, err := store.Acquire(ctx, "k", limit, 1, ran); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	for range 200 {
		sluice.ReleaseAbandoned(store, "k", sluice.NewHolderID()) // never acquired: tried again in a second
	}
	sluice.ReleaseAbandoned(store, "k", ran)
	for end := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		slot, _, err := sluice.AcquireSlot(ctx, store, "k", limit, 1)
		if err != nil {
			t.Fatal(err)
		}
		if slot != nil {
			slot.Release(ctx)
			break
		}
		if time.Now().After(end) {
			t.Fatal("the abandoned holder that ran still holds 3s later")
		}
	}
}

// WaitReleases waits for the releases at work in the background, so that
// a process that stops while Redis is away briefly still frees the slots
// whose release failed; with the store still unreachable it returns when
// its context ends, with the count left. Not parallel: it counts the
// process's releases.
func TestWaitReleases(t *testing.T) {
	ctx := context.Background()
	if n := sluice.WaitReleases(ctx); n != 0 { // those of earlier tests
		t.Fatalf("WaitReleases with no deadline: %d left", n)
	}
	srv, client, store, limit, slot := failedRelease(t)
	if err := sluice.RetryRelease(store, "k", slot.Holder(), time.Now().Add(limit.Hold), nil); err != nil {
		t.Fatal(err)
	}
	if n := sluice.PendingReleases(); n != 1 {
		t.Errorf("PendingReleases = %d, want 1", n)
	}
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		time.Sleep(500 * time.Millisecond)
		srv.Start(t)
	}()
	// The cleanup's Stop must see the Start: the release's answer orders
	// nothing between the goroutines.
	defer func() { <-restarted }()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	if n := sluice.WaitReleases(wctx); n != 0 {
		t.Fatalf("WaitReleases with Redis back in 0.5s: %d left after %v", n, time.Since(start))
	}
	t.Logf("released %v after the wait began", time.Since(start))
	<-restarted
	client.Close() // as a process that stops: nothing more is sent
	check := redisstore.New(srv.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	other, d, err := sluice.AcquireSlot(ctx, check, "k", limit, 1)
	if err != nil || other == nil {
		t.Fatalf("the slot whose release failed still held after WaitReleases: %+v %v", d, err)
	}
	other.Release(ctx)

	// The store unreachable for good: bounded by the context.
	deadStore := unreachable(t)
	for range 3 {
		if err := sluice.RetryRelease(deadStore, "k", sluice.NewHolderID(), time.Now().Add(2*time.Second), nil); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	if n := sluice.WaitReleases(wctx); n != 3 {
		t.Errorf("WaitReleases with the store unreachable: %d left, want 3", n)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("WaitReleases with a 300ms context took %v", took)
	}
	if n := sluice.WaitReleases(wctx); n != 3 { // ended: at once
		t.Errorf("WaitReleases with an ended context: %d, want 3", n)
	}
	if n := sluice.WaitReleases(ctx); n != 0 { // they give up at until
		t.Errorf("WaitReleases past until: %d left", n)
	}
}

// With MaxBackgroundReleases at work, the release of an abandoned holder
// is not sent and TryReleaseAbandoned says so, as AcquireSlot's
// ReleaseDropped does for an acquire that failed; ReleaseAbandoned stays
// silent. Before, nothing told it. Not parallel: it fills the process's
// bound.
func TestTryReleaseAbandonedFull(t *testing.T) {
	ctx := context.Background()
	store := unreachable(t)
	if err := sluice.TryReleaseAbandoned(nil, "k", "h"); !errors.Is(err, sluice.ErrInvalidLimit) || !errors.Is(err, sluice.ErrStoreNotBuilt) {
		t.Errorf("TryReleaseAbandoned(nil store) = %v, want ErrInvalidLimit and ErrStoreNotBuilt", err)
	}
	releasetest.Fill(t, time.Now().Add(2*time.Second))
	if err := sluice.TryReleaseAbandoned(store, "k", sluice.NewHolderID()); !errors.Is(err, sluice.ErrRetriesFull) {
		t.Errorf("TryReleaseAbandoned with the bound full = %v, want ErrRetriesFull", err)
	}
	sluice.ReleaseAbandoned(store, "k", sluice.NewHolderID())
	slot, d, err := sluice.AcquireSlot(ctx, store, "k", sluice.Concurrent(1, time.Minute), 1)
	if err == nil || slot != nil {
		t.Fatalf("AcquireSlot with the store unreachable = %v, %v; want an error", slot, err)
	}
	if !d.ReleaseDropped {
		t.Error("AcquireSlot's error, its release not sent: ReleaseDropped false")
	}
}

// A release sent again to a store whose client was closed stops at its
// next try: a closed store never answers. Before, it tried every 3s until
// its hold ended (30s here). Not parallel: it counts the process's
// releases.
func TestRetryReleaseStopsOnClosedStore(t *testing.T) {
	_, client, store, limit, slot := failedRelease(t)
	answered := make(chan bool, 1)
	if err := sluice.RetryRelease(store, "k", slot.Holder(), time.Now().Add(limit.Hold), func(held bool) { answered <- held }); err != nil {
		t.Fatal(err)
	}
	if n := sluice.PendingReleases(); n != 1 {
		t.Fatalf("PendingReleases = %d, want 1", n)
	}
	client.Close()
	start := time.Now()
	for sluice.PendingReleases() != 0 {
		if time.Since(start) > 2*time.Second {
			t.Fatalf("release still pending %v after the client was closed", time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("ended %v after the client was closed", time.Since(start))
	if len(answered) != 0 {
		t.Error("done called without an answer")
	}
}

// WaitReleases wakes a retry asleep in its backoff: with the store back,
// a stop sends it at once rather than at the retry's next try, up to 3s
// later. Not parallel: it waits for the process's releases.
func TestWaitReleasesWakesRetries(t *testing.T) {
	ctx := context.Background()
	srv, client, store, limit, slot := failedRelease(t)
	if err := sluice.RetryRelease(store, "k", slot.Holder(), time.Now().Add(limit.Hold), nil); err != nil {
		t.Fatal(err)
	}
	// Tries fail at 0.1, 0.3, 0.7, 1.5 and 3.1s; the next waits 3s.
	time.Sleep(3600 * time.Millisecond)
	srv.Start(t)
	if _, err := client.Ping(ctx).Result(); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	if n := sluice.WaitReleases(wctx); n != 0 {
		t.Fatalf("WaitReleases: %d left", n)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("WaitReleases with the store back took %v, want the retry woken at once", took)
	} else {
		t.Logf("WaitReleases took %v", took)
	}
	other, d, err := sluice.AcquireSlot(ctx, store, "k", limit, 1)
	if err != nil || other == nil {
		t.Fatalf("the slot still held after WaitReleases: %+v %v", d, err)
	}
	other.Release(ctx)
}
