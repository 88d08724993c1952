package server

import (
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// refusalLinger: a refusal sent before its request's body was read closes
// the connection this long after at most, reading (and dropping) what
// comes meanwhile: closing with bytes unread would reset the connection,
// and a client still sending could lose the answer. As net/http's own
// wait before it closes after a body too large.
var refusalLinger = 500 * time.Millisecond

// httpRequests is the HTTP server's outermost handler. It tells the cap
// whether each request has arrived whole (its body read to the end): a
// connection whose requests in progress have not is stalled. And a
// refusal (a status of 400 or more) written before the body was read
// closes the connection (Connection: close) instead of reading the rest
// first, which net/http would do, at the client's pace, for up to the
// read timeout: a refused client sending slowly would hold the connection
// as long, and get its answer only then.
func (l *capListener) httpRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(capConnKey{}).(*capConn)
		if c == nil {
			next.ServeHTTP(w, r)
			return
		}
		q := &httpRequest{l: l, c: c, http1: r.ProtoMajor == 1}
		whole := r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0
		l.begin(q, whole)
		defer l.end(q)
		if !whole {
			// A copy: net/http judges what is left of the body by the
			// request it holds.
			r = r.WithContext(r.Context())
			r.Body = &arrivingBody{ReadCloser: r.Body, left: r.ContentLength, q: q}
		}
		next.ServeHTTP(&refusalWriter{ResponseWriter: w, q: q}, r)
	})
}

// httpRequest is one request's progress, for the cap.
type httpRequest struct {
	l     *capListener
	c     *capConn
	http1 bool
	gen   int // c.gen at its start: its counts are void once c went idle
	whole atomic.Bool
	ended bool // under l.mu
}

// begin counts q on its connection, whole (no body) or not.
func (l *capListener) begin(q *httpRequest, whole bool) {
	q.whole.Store(whole)
	l.mu.Lock()
	defer l.mu.Unlock()
	q.gen = q.c.gen
	if whole {
		q.c.busy++
	} else {
		q.c.waiting++
	}
	l.relistLocked(q.c)
}

// arrived marks q's body read to its end.
func (l *capListener) arrived(q *httpRequest) {
	if q.whole.Swap(true) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if q.gen != q.c.gen || q.ended {
		return
	}
	q.c.waiting--
	q.c.busy++
	l.relistLocked(q.c)
}

// end uncounts q as its handler returns. An HTTP/1 body not read to its
// end is still arriving (net/http reads the rest, or closes): it counts
// until the connection is idle (httpConnState) or closed.
func (l *capListener) end(q *httpRequest) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q.gen != q.c.gen {
		return
	}
	q.ended = true
	switch {
	case q.whole.Load():
		q.c.busy--
	case !q.http1:
		q.c.waiting--
	}
	l.relistLocked(q.c)
}

// arrivingBody reports its request whole once read to its end: to EOF,
// or to its Content-Length (a JSON decoder need not read on to EOF).
type arrivingBody struct {
	io.ReadCloser
	left int64 // -1: unknown
	q    *httpRequest
}

func (b *arrivingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.left >= 0 {
		b.left -= int64(n)
	}
	if err == io.EOF || (b.left == 0 && n > 0) {
		b.q.l.arrived(b.q)
	}
	return n, err
}

// refusalWriter closes the connection of a refusal written before its
// request's body was read (HTTP/1; HTTP/2 resets the stream instead of
// reading).
type refusalWriter struct {
	http.ResponseWriter
	q     *httpRequest
	wrote bool
}

func (w *refusalWriter) WriteHeader(code int) {
	if !w.wrote && code >= http.StatusOK {
		w.wrote = true
		if code >= http.StatusBadRequest && w.q.http1 && !w.q.whole.Load() {
			w.Header().Set("Connection", "close")
			// What the client sends meanwhile is read and dropped.
			http.NewResponseController(w.ResponseWriter).SetReadDeadline(time.Now().Add(refusalLinger))
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *refusalWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *refusalWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
