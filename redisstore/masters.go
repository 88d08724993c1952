package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/ctxutil"
)

// ErrPartial: on a Redis Cluster, some masters failed a check while the
// others passed it (*PartialError). The failing masters' keys fail; the
// others' decide on Redis.
var ErrPartial = errors.New("redisstore: some Redis Cluster masters fail")

// PartialError is Check's and CheckAccess's error on a Redis Cluster when
// some masters fail and the others pass. errors.Is matches ErrPartial, and
// through the masters' errors their kinds (ErrUnreachable, ErrStalled,
// ErrMisconfigured, ...); errors.As finds the first failing master's
// *CheckError. Where every master fails, the error is one master's
// *CheckError instead.
type PartialError struct {
	// Failed maps each failing master, by address, to its *CheckError.
	Failed map[string]error
	// Answered is the masters that passed, by address, sorted.
	Answered []string
}

// Addrs is the failing masters' addresses, sorted.
func (e *PartialError) Addrs() []string {
	if e == nil {
		return nil
	}
	addrs := make([]string, 0, len(e.Failed))
	for a := range e.Failed {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	return addrs
}

func (e *PartialError) Error() string {
	if e == nil {
		return ErrPartial.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d of %d", ErrPartial.Error(), len(e.Failed), len(e.Failed)+len(e.Answered))
	for i, a := range e.Addrs() {
		sep := "; "
		if i == 0 {
			sep = " ("
		}
		b.WriteString(sep + a + ": " + e.Failed[a].Error())
	}
	if len(e.Failed) > 0 {
		b.WriteString(")")
	}
	return b.String()
}

// Is matches ErrPartial.
func (e *PartialError) Is(target error) bool { return target == ErrPartial }

// Unwrap is the failing masters' errors, in the order of their addresses.
func (e *PartialError) Unwrap() []error {
	if e == nil {
		return nil
	}
	errs := make([]error, 0, len(e.Failed))
	for _, a := range e.Addrs() {
		errs = append(errs, e.Failed[a])
	}
	return errs
}

// JoinMasters joins the results of checks of one Redis Cluster's masters
// (Check's and CheckAccess's): a master fails if it failed any of them.
// It is nil if every check passed, a *PartialError if some masters
// answered every check, and otherwise one error: the first error that is
// not a *PartialError, or one failing master's.
func JoinMasters(errs ...error) error {
	failed := map[string]error{}
	answered := map[string]bool{}
	for _, err := range errs {
		if err == nil {
			continue
		}
		var pe *PartialError
		if !errors.As(err, &pe) {
			return err
		}
		for a, e := range pe.Failed {
			if failed[a] == nil {
				failed[a] = e
			}
		}
		for _, a := range pe.Answered {
			answered[a] = true
		}
	}
	results := make(map[string]error, len(failed)+len(answered))
	for a := range answered {
		results[a] = nil
	}
	for a, e := range failed {
		results[a] = e
	}
	return mastersErr(results)
}

// mastersErr is the error of a check of every master, from each one's
// result (nil: passed): see JoinMasters. When every master failed it is a
// misconfigured one's error if there is one (someone must act), else the
// first by address.
func mastersErr(results map[string]error) error {
	pe := &PartialError{Failed: map[string]error{}}
	for a, err := range results {
		if err == nil {
			pe.Answered = append(pe.Answered, a)
		} else {
			pe.Failed[a] = err
		}
	}
	switch {
	case len(pe.Failed) == 0:
		return nil
	case len(pe.Answered) > 0:
		slices.Sort(pe.Answered)
		return pe
	}
	errs := pe.Unwrap()
	for _, err := range errs {
		if errors.Is(err, ErrMisconfigured) {
			return err
		}
	}
	return errs[0]
}

// slotKeys returns, for each hash slot, a key under prefix in that slot,
// "" for a slot none is in: under a prefix with a hash tag of its own
// every key is in one slot, so that only its master holds sluice's keys.
// Built once per prefix.
func slotKeys(prefix string) []string {
	if keys, ok := slotKeyTables.Load(prefix); ok {
		return keys.([]string)
	}
	keys := make([]string, 16384)
	if _, tagged := tagOf(prefix); tagged {
		k := prefix + "check"
		keys[slot(k)] = k
	} else {
		// About 170,000 candidates fill every slot; a cap, should a
		// prefix defeat the tags.
		for i, left := 0, len(keys); left > 0 && i < 1<<22; i++ {
			k := prefix + "check{" + strconv.Itoa(i) + "}"
			if s := slot(k); keys[s] == "" {
				keys[s] = k
				left--
			}
		}
	}
	v, _ := slotKeyTables.LoadOrStore(prefix, keys)
	return v.([]string)
}

var slotKeyTables sync.Map // prefix → []string

// clusterMaster is one master of a Cluster's slot map, with a key under
// the checking prefix in one of its slots.
type clusterMaster struct {
	addr string
	node *redis.Client
	key  string
}

// clusterMasters returns the masters of cc's slot map, as it routes calls,
// each once with a key under prefix: from memory (no reload, which asks
// one node after another and may wait out a stopped one), but for the
// load of a client that has no map yet. Masters no key under prefix is on
// are left out.
func clusterMasters(ctx context.Context, cc *redis.ClusterClient, prefix string) ([]clusterMaster, error) {
	var masters []clusterMaster
	err := boundedErr(ctx, func() error {
		seen := map[string]bool{}
		for _, k := range slotKeys(prefix) {
			if k == "" {
				continue
			}
			node, err := cc.MasterForKey(ctx, k)
			if err != nil {
				return err
			}
			if addr := node.Options().Addr; !seen[addr] {
				seen[addr] = true
				masters = append(masters, clusterMaster{addr: addr, node: node, key: k})
			}
		}
		return nil
	})
	if err != nil {
		return nil, Classify(err)
	}
	return masters, nil
}

// eachMaster runs check on every master at once and joins the results
// (mastersErr). It returns as soon as ctx ends: a master whose check has
// not ended then fails as stalled if it answered (check called answered;
// named as its shutdown if check set shutdown, from INFO), else as
// unreachable, each wrapping ctx's error, so that the masters that passed
// are still told from a stopped one.
func eachMaster(ctx context.Context, masters []clusterMaster, check func(ctx context.Context, m clusterMaster, answered func(), shutdown *atomic.Bool) error) error {
	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(masters))
	answered := make([]atomic.Bool, len(masters))
	shutdown := make([]atomic.Bool, len(masters))
	for i, m := range masters {
		go func() {
			results <- result{i, check(ctx, m, func() { answered[i].Store(true) }, &shutdown[i])}
		}()
	}
	errs := make(map[string]error, len(masters))
	for range masters {
		select {
		case r := <-results:
			errs[masters[r.i].addr] = r.err
			continue
		case <-ctx.Done():
		}
		for i, m := range masters {
			if _, ok := errs[m.addr]; ok {
				continue
			}
			err := fmt.Errorf("no answer from %s before the check's end: %w", m.addr, ctx.Err())
			if answered[i].Load() {
				errs[m.addr] = stalledOn(err, shutdown[i].Load())
			} else {
				errs[m.addr] = Classify(err)
			}
		}
		break
	}
	for a, err := range errs {
		errs[a] = Classify(err) // the *CheckError itself
	}
	return mastersErr(errs)
}

// Masters returns the masters of cc's slot map, as it routes calls: from
// memory, with no reload (go-redis's ForEachMaster reloads first, asking
// one node after another, so a stopped node can hold it to its deadline).
// A client's first map is loaded as a Store loads it, with several
// reloads at once, the first answer winning, on the first call of Masters
// or Check given the client.
func Masters(ctx context.Context, cc *redis.ClusterClient) ([]*redis.Client, error) {
	if cc == nil {
		return nil, ErrNoClient
	}
	ctx = ctxutil.OrBackground(ctx)
	if err := awaitClientMap(ctx, cc); err != nil {
		return nil, Classify(err)
	}
	ms, err := clusterMasters(ctx, cc, "")
	if err != nil {
		return nil, err
	}
	nodes := make([]*redis.Client, len(ms))
	for i, m := range ms {
		nodes[i] = m.node
	}
	return nodes, nil
}
