package tunnel

import (
	"sync"

	"github.com/warren-tunnel/warren/tunnel/store"
)

// routeWrites orders the route book's store writes per key (a route, or a cluster's port
// reservation) without making anyone who does not write that key wait for them.
//
// The registry tells the book that a route emptied (Registry.Leave → OnRemove → emptied)
// while it holds the route's shard lock, which every route of the shard shares; a store call
// there (an fsync, or in a cluster a NATS round trip with retries) would hold up them all.
// So the book only queues that write, in memory, under the lock, and it runs afterwards; a
// later write of the same route (the next claim, the join after it) queues behind it, so
// that the record still changes in the order the registry changed. Writes of other keys
// run at once, side by side.
type routeWrites struct {
	mu     sync.Mutex
	queues map[string]*writeQueue // the keys with a write running; the writes waiting behind it
	wg     sync.WaitGroup         // the goroutines running queued writes (wait)
}

type writeQueue struct{ ops []func() }

// later queues op for key behind the writes of key running or queued, and returns at once.
func (w *routeWrites) later(key string, op func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if q := w.queues[key]; q != nil {
		q.ops = append(q.ops, op)
		return
	}
	q := &writeQueue{ops: []func(){op}}
	if w.queues == nil {
		w.queues = map[string]*writeQueue{}
	}
	w.queues[key] = q
	w.wg.Add(1)
	go w.drain(key, q)
}

// now runs op for key after the writes of key queued before it, and returns once it ran.
// With none queued it runs op on the caller's goroutine.
func (w *routeWrites) now(key string, op func()) {
	w.mu.Lock()
	if q := w.queues[key]; q != nil {
		done := make(chan struct{})
		q.ops = append(q.ops, func() { op(); close(done) })
		w.mu.Unlock()
		<-done
		return
	}
	q := &writeQueue{}
	if w.queues == nil {
		w.queues = map[string]*writeQueue{}
	}
	w.queues[key] = q // writes of key queue behind this one
	w.mu.Unlock()
	op()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(q.ops) == 0 {
		delete(w.queues, key)
		return
	}
	w.wg.Add(1)
	go w.drain(key, q)
}

// drain runs q's writes in order until none is left.
func (w *routeWrites) drain(key string, q *writeQueue) {
	defer w.wg.Done()
	for {
		w.mu.Lock()
		if len(q.ops) == 0 {
			delete(w.queues, key)
			w.mu.Unlock()
			return
		}
		op := q.ops[0]
		q.ops = q.ops[1:]
		w.mu.Unlock()
		op()
	}
}

// wait waits until every queued write ran.
func (w *routeWrites) wait() { w.wg.Wait() }

// update is the book's store Update of key, ordered behind the writes of key queued before
// it (routeWrites).
func (b *routeBook) update(key string, fn func(cur *store.Route) (*store.Route, error)) (r *store.Route, err error) {
	b.writes.now(key, func() { r, err = b.st.Update(b.ctx, key, fn) })
	return r, err
}
