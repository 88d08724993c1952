package lease

import (
	"context"
	"sync"

	"github.com/sluicehq/sluice"
)

// grantBatch sends the grants of a TakeAll's checks in one call, over a
// granter that is a sluice.GrantAller (redisstore, resilient over it):
// each check is spent on a goroutine of its own (spendTogether), and each
// that needs a grant stops there (grantTurn.grant) until every other has
// asked for one or has left the batch; then the TakeAll's goroutine sends
// them all (send). A batching store sent separate grants in as many
// batches as it had room for in flight (two round trips for four grants
// with redisstore's defaults); in one call, one.
//
// A check leaves (grantTurn.leave) when it is done without a grant, and
// before it waits for another request's grant of its key: a batch that
// waited for it could wait for a request that waits, in turn, for this
// TakeAll's grants. A check that left and needs a grant after all sends
// it alone.
type grantBatch struct {
	mu      sync.Mutex
	pending int // checks neither in the batch nor gone
	reqs    []sluice.GrantRequest
	ready   chan struct{} // closed when pending reaches 0
	res     []sluice.GrantResult
	done    chan struct{} // closed once res is in
}

func newGrantBatch(checks int) *grantBatch {
	return &grantBatch{pending: checks, ready: make(chan struct{}), done: make(chan struct{})}
}

// send waits until no check may ask for a grant any more, then sends
// those asked for in one call of ga, and wakes their checks.
func (b *grantBatch) send(ctx context.Context, ga sluice.GrantAller) {
	<-b.ready
	if len(b.reqs) > 0 {
		b.res = ga.GrantAll(ctx, b.reqs)
	}
	close(b.done)
}

// arrive counts a check out of pending, adding req to the batch when it
// is not nil, and returns req's index.
func (b *grantBatch) arrive(req *sluice.GrantRequest) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := len(b.reqs)
	if req != nil {
		b.reqs = append(b.reqs, *req)
	}
	if b.pending--; b.pending == 0 {
		close(b.ready)
	}
	return i
}

// grantTurn is one check's place in a grantBatch. A nil *grantTurn is
// no batch: its check sends its grant alone.
type grantTurn struct {
	b      *grantBatch
	called bool // asked for its grant or left
}

// joined reports whether t's check may still send its grant with the
// batch.
func (t *grantTurn) joined() bool { return t != nil && !t.called }

// leave takes t's check out of the batch, if it is in.
func (t *grantTurn) leave() {
	if t.joined() {
		t.called = true
		t.b.arrive(nil)
	}
}

// grant sends req with the batch and returns its reply: Regrant's (its
// Returned 0 for a Grant).
func (t *grantTurn) grant(req sluice.GrantRequest) (int64, sluice.Grant, error) {
	t.called = true
	i := t.b.arrive(&req)
	<-t.b.done
	r := t.b.res[i]
	return r.Returned, r.Grant, r.Err
}
