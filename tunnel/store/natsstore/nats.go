package natsstore

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warren-tunnel/warren/tunnel/store"
)

// Defaults of Config.
const (
	// DefaultBucket is the key-value bucket Open uses when Config.Bucket is "".
	DefaultBucket = "warren_routes"
	// DefaultReplicas is the replica count of a bucket Open creates when Config.Replicas is
	// not set.
	DefaultReplicas = 1
	// DefaultTimeout bounds each request to NATS when Config.Timeout is not set.
	DefaultTimeout = 5 * time.Second
)

// natsMaxTries bounds the read-fn-write rounds of one Store.Update that keep losing to other
// writers; natsMaxBackoff bounds the random pause before each retry.
const (
	natsMaxTries   = 50
	natsMaxBackoff = 20 * time.Millisecond
)

// ErrConflict is the error (matched with errors.Is) of an Update that lost the race for its
// key to other writers too many times in a row (only a store shared between processes has
// such races). Nothing was written; the caller may try again.
var ErrConflict = errors.New("store: too many concurrent updates of one key")

// ErrCorrupt is the error (matched with errors.Is) of a call that met a bucket holding
// something that is not a route: a value that does not decode, or a key that no store key
// encodes to. The error's text names the bucket and the key.
var ErrCorrupt = errors.New("store: route bucket is corrupt")

// corruptError is an ErrCorrupt whose text says which bucket and key, and why.
type corruptError struct {
	msg string // what follows "store: "
	err error  // the cause
}

func (e *corruptError) Error() string        { return "store: " + e.msg }
func (e *corruptError) Is(target error) bool { return target == ErrCorrupt }
func (e *corruptError) Unwrap() error        { return e.err }

// Config configures Open. The zero value is the defaults.
type Config struct {
	// Bucket is the JetStream key-value bucket that holds the routes (DefaultBucket if
	// empty). Every edge of one cluster names the same bucket.
	Bucket string
	// Replicas is the bucket's replica count when Open creates it (DefaultReplicas if
	// zero or less): 3 or 5 in a NATS cluster, so that the routes survive the loss of a
	// server. An existing bucket keeps the replica count it was created with.
	Replicas int
	// Timeout bounds each request to NATS — opening the bucket, and each read or write of
	// Update, Get and List (DefaultTimeout if zero or less). The context the call was given
	// bounds it too: whichever ends first ends the request.
	Timeout time.Duration
}

// Store is a store.Store in a NATS JetStream key-value bucket, shared by every edge of a
// cluster.
//
// Each route is one key of the bucket (see the key encoding below), its value the route's
// JSON, as boltstore stores it. A bucket Open creates keeps one revision per key (history 1)
// in file storage; Update reads only the last revision, so a bucket with more history works
// the same.
//
// Update is optimistic compare-and-set, done by JetStream, not by warren: it reads the key
// and its revision, calls fn, and writes with the bucket's create-only (the key must still be
// absent) or update-at-revision (the key must still be at the revision read) operation, or
// deletes at that revision. When another writer changed the key in between, the write is
// refused and Update reads again and calls fn again, up to 50 times, then fails with
// ErrConflict. Updates of one key through one Store value are serialised in the process, so
// they never conflict with each other; only writers elsewhere do. An Update that changes
// nothing writes nothing.
//
// Writes go through JetStream to the bucket's stream leader. A write Update reports done has
// been stored by the stream: on a replicated bucket, by a quorum of its servers. (A JetStream
// server fsyncs its files every sync_interval, two minutes by default, so with one replica a
// power loss can lose the last writes; run three replicas, or set the server's sync_interval
// to always, where that matters.) Get and List use JetStream's direct get, which on a
// replicated bucket any replica may answer: one a moment behind can answer with the route as
// it was before the last Update. Update itself is never misled: a write based on a stale
// read is refused and retried.
//
// An Update whose write request fails (it times out, or the connection drops) may still have
// been stored: the caller sees the error, and the key holds the new route. An fn that
// computes its result from cur, with no side effects (as store.Store asks), makes retrying
// such an Update safe.
//
// # Key encoding
//
// A NATS key allows only the characters [-/_=.a-zA-Z0-9], and its '.'-separated tokens must
// not be empty. A store key ("http/<subdomain>", "tcp/<group name>") is split at its first
// '/' into the kind and the label; each becomes one token, and the NATS key is the kind's
// token, '.', the label's token:
//
//   - a non-empty part of only [-_a-zA-Z0-9] (every DNS label, the kinds, most group
//     names) is its own token: "http/web" is the NATS key "http.web";
//   - any other part (empty, or with another character: a group name may hold any byte,
//     '/' and '.' included) is '=' followed by the part in unpadded base64url (RFC 4648 §5,
//     alphabet [-_a-zA-Z0-9]): "tcp/my group" is "tcp.=bXkgZ3JvdXA".
//
// A plain token never starts with '=', so the encoding is reversible (a store key with no
// '/' is one token). The kind is always the first token and the label the second, so a NATS
// subject filter such as "tcp.*" selects every TCP route, and "tcp.web" one. A 128-byte
// group name (the wire's limit) makes a NATS key of at most 176 characters.
//
// A bucket that vanished under an open store (its NATS store was wiped, or it was deleted)
// is created again, empty, by the first request that finds it missing, with the
// configuration Open would give it; the routes it held are lost, as they were already.
//
// The context a call takes bounds all of it: each request to NATS ends when the context is
// done or after Config.Timeout, whichever comes first, and so do an Update's waits — for
// another Update of its key in this process, and between its retries — and the creation of
// a vanished bucket with its pauses. A call cut short fails with an error that errors.Is
// matches to the context's error; an Update whose write request was under way may still
// have written (as when the request times out).
//
// Open it with Open; it is safe for concurrent use. Close releases it but leaves the
// connection, which belongs to the caller, open.
type Store struct {
	// mu is held shared by every call for its whole length and exclusively by Close, so that
	// Close waits for calls in flight (which it first cancels) and no call starts after it.
	mu     sync.RWMutex
	closed bool

	kv      jetstream.KeyValue
	bucket  string
	timeout time.Duration
	// js and create make the bucket again when it vanished (recreate); remu serialises that.
	// kv stays: a handle names the bucket, so it works on the bucket made again.
	js     jetstream.JetStream
	create jetstream.KeyValueConfig
	remu   sync.Mutex

	// ctx is cancelled by Close, ending the calls in flight (callContext).
	ctx    context.Context
	cancel context.CancelFunc

	// keys serialises the Updates of one key in this process.
	keysMu sync.Mutex
	keys   map[string]*keyLock

	// maxTries and maxBackoff are natsMaxTries and natsMaxBackoff (tests change them).
	maxTries   int
	maxBackoff time.Duration
}

var _ store.Store = (*Store)(nil)

// keyLock is a lock on one key, held by one Update at a time; n counts its holders and
// waiters, so that the last one removes it.
type keyLock struct {
	ch chan struct{} // holds one token while locked
	n  int
}

// Open opens the route store in the JetStream key-value bucket cfg.Bucket on nc,
// creating the bucket (history 1, file storage, cfg.Replicas replicas) if it does not exist,
// or binding to it as it is if it does. It fails if nc has no JetStream, if the bucket cannot
// be created or bound within ctx and cfg.Timeout, or if the existing bucket has a TTL (its
// routes would expire). Several stores, in one process or many, may open one bucket: that is
// how the edges of a cluster share their routes.
//
// The store uses nc but does not own it: Close leaves it open, and the caller closes it
// after the store.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Store, error) {
	if nc == nil {
		return nil, errors.New("store: open NATS bucket: no NATS connection")
	}
	if cfg.Bucket == "" {
		cfg.Bucket = DefaultBucket
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = DefaultReplicas
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("store: open NATS bucket %s: %w", cfg.Bucket, err)
	}
	octx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	create := jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "warren routes: owner, pool and public ports of every route",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	}
	kv, _, err := OpenOrCreateKV(octx, js, create)
	if err != nil {
		return nil, fmt.Errorf("store: open NATS bucket %s: %w", cfg.Bucket, err)
	}
	st, err := kv.Status(octx)
	if err != nil {
		return nil, fmt.Errorf("store: open NATS bucket %s: %w", cfg.Bucket, err)
	}
	if st.TTL() > 0 {
		return nil, fmt.Errorf("store: NATS bucket %s has a TTL of %v: routes in it would expire; use a bucket with no TTL", cfg.Bucket, st.TTL())
	}
	sctx, scancel := context.WithCancel(context.Background())
	return &Store{
		kv: kv, js: js, create: create, bucket: cfg.Bucket, timeout: cfg.Timeout,
		ctx: sctx, cancel: scancel,
		keys:     map[string]*keyLock{},
		maxTries: natsMaxTries, maxBackoff: natsMaxBackoff,
	}, nil
}

// Bucket returns the name of the store's key-value bucket.
func (s *Store) Bucket() string { return s.bucket }

// Update implements store.Store; see Store for how it resolves races with other writers. fn
// may be called more than once (each time with a freshly decoded copy of the route then
// stored); it must not call this store's Update for the same key (that would deadlock).
func (s *Store) Update(ctx context.Context, key string, fn func(cur *store.Route) (*store.Route, error)) (*store.Route, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, store.ErrClosed
	}
	ctx, cancel := s.callContext(ctx)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return nil, s.opError(ctx, "update", key, err)
	}
	nk := natsKey(key)
	unlock, err := s.lockKey(ctx, nk)
	if err != nil {
		return nil, s.opError(ctx, "update", key, err)
	}
	defer unlock()

	for try := range s.maxTries {
		if try > 0 {
			if err := s.backoff(ctx, try); err != nil {
				return nil, s.opError(ctx, "update", key, err)
			}
		}
		old, rev, err := s.read(ctx, "update", key, nk)
		if err != nil {
			return nil, err
		}
		var cur *store.Route
		if old != nil {
			if cur, err = s.decode(key, old); err != nil {
				return nil, err
			}
		}
		next, err := fn(cur)
		if err != nil {
			return nil, err
		}
		var out *store.Route
		if next == nil {
			if old == nil {
				return nil, nil
			}
			err = s.do(ctx, func(ctx context.Context) error {
				return s.kv.Delete(ctx, nk, jetstream.LastRevision(rev))
			})
		} else {
			data, merr := json.Marshal(next)
			if merr != nil {
				return nil, fmt.Errorf("store: encode route %q: %w", key, merr)
			}
			// What Update returns is what the store now holds: the route as it decodes.
			if out, err = s.decode(key, data); err != nil {
				return nil, err
			}
			if bytes.Equal(data, old) {
				return out, nil
			}
			err = s.write(ctx, nk, data, old != nil, rev)
		}
		if err == nil {
			return out, nil
		}
		if !isConflict(err) {
			return nil, s.opError(ctx, "update", key, err)
		}
	}
	return nil, fmt.Errorf("store: update %q in NATS bucket %s: %w (lost to other writers %d times in a row)",
		key, s.bucket, ErrConflict, s.maxTries)
}

// write stores data at nk: create-only if the key was absent, else at revision rev.
func (s *Store) write(ctx context.Context, nk string, data []byte, present bool, rev uint64) error {
	return s.do(ctx, func(ctx context.Context) error {
		var err error
		if present {
			_, err = s.kv.Update(ctx, nk, data, rev)
		} else {
			// Create also succeeds over a delete marker (a key deleted before), at the
			// marker's revision.
			_, err = s.kv.Create(ctx, nk, data)
		}
		return err
	})
}

// Get implements store.Store. On a replicated bucket a replica a moment behind may answer
// (see Store).
func (s *Store) Get(ctx context.Context, key string) (*store.Route, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, store.ErrClosed
	}
	ctx, cancel := s.callContext(ctx)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return nil, s.opError(ctx, "get", key, err)
	}
	v, _, err := s.read(ctx, "get", key, natsKey(key))
	if err != nil || v == nil {
		return nil, err
	}
	return s.decode(key, v)
}

// read returns the value and revision at the NATS key nk (of the store key key), or nil if
// it is absent or deleted; ctx is the call's (callContext), op names the call in errors.
func (s *Store) read(ctx context.Context, op, key, nk string) (value []byte, rev uint64, err error) {
	var e jetstream.KeyValueEntry
	err = s.do(ctx, func(ctx context.Context) error {
		var err error
		e, err = s.kv.Get(ctx, nk)
		return err
	})
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, 0, nil
	case err != nil:
		return nil, 0, s.opError(ctx, op, key, err)
	}
	if e.Value() == nil {
		// A put of an empty value: not a route. (A stored route is never empty.)
		return []byte{}, e.Revision(), nil
	}
	return e.Value(), e.Revision(), nil
}

// List implements store.Store: every route, in store key (byte) order, each at the last
// revision it had when List started (read through one JetStream consumer of the last
// revision of every key). Deleted keys are skipped.
func (s *Store) List(ctx context.Context) ([]*store.Route, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, store.ErrClosed
	}
	callCtx, cancelCall := s.callContext(ctx)
	defer cancelCall()
	if err := callCtx.Err(); err != nil {
		return nil, s.opError(callCtx, "list", "", err)
	}
	ctx, cancel := context.WithTimeout(callCtx, s.timeout)
	defer cancel()
	w, err := s.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	for try := 0; err != nil && try < maxRecreates && s.recreate(ctx, try, err); try++ {
		w, err = s.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	}
	if err != nil {
		return nil, s.opError(callCtx, "list", "", err)
	}
	defer func() {
		// Stop ends the watcher's subscription, whose goroutine then closes Updates; until
		// then it may be blocked handing over a later change, so drain it.
		_ = w.Stop()
		go func() {
			for range w.Updates() {
			}
		}()
	}()
	type item struct {
		rev uint64
		val []byte
	}
	got := map[string]item{}
	for done := false; !done; {
		select {
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return nil, s.opError(callCtx, "list", "", errors.New("the watcher stopped"))
			case e == nil: // every key's last revision is in
				done = true
			default:
				key, err := storeKey(e.Key())
				if err != nil {
					return nil, s.corrupt(fmt.Errorf("key %q is not a route key: %w", e.Key(), err))
				}
				// An ordered consumer that restarts may hand a key over twice: keep the last.
				if it, seen := got[key]; !seen || e.Revision() > it.rev {
					got[key] = item{rev: e.Revision(), val: e.Value()}
				}
			}
		case <-ctx.Done():
			return nil, s.opError(callCtx, "list", "", ctx.Err())
		}
	}
	out := make([]*store.Route, 0, len(got))
	for _, k := range slices.Sorted(maps.Keys(got)) {
		r, err := s.decode(k, got[k].val)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// Close implements store.Store: it cancels the requests of calls in flight (they fail with
// store.ErrClosed; an Update among them may or may not have written), waits for those calls
// to return, and releases the store. It leaves the NATS connection open. Closing again does
// nothing and returns nil.
func (s *Store) Close() error {
	s.cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// callContext returns the context of one call given ctx: done when ctx is, or when Close
// cancels the calls in flight.
func (s *Store) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// do runs one request to NATS within ctx, the call's (callContext), and the store's timeout;
// a request that failed because the bucket is gone is made again once the bucket is
// (recreate).
func (s *Store) do(ctx context.Context, op func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	err := op(ctx)
	for try := 0; err != nil && try < maxRecreates && s.recreate(ctx, try, err); try++ {
		err = op(ctx)
	}
	return err
}

// maxRecreates bounds the times one request creates its vanished bucket again and retries,
// waiting a little longer each time (1.4 s in all): right after a bucket is deleted,
// JetStream may still answer that it exists or refuse to create it again, and one just
// created may not answer at once.
const maxRecreates = 8

// recreate creates the bucket again, empty, as Open would, when err says it does not
// exist (its NATS store was wiped, or it was deleted): the routes it held are lost either
// way, and without it no route could be written again until every edge restarted. It reports
// whether the bucket exists now, created by this call or another writer; try counts the
// earlier attempts of the same request.
func (s *Store) recreate(ctx context.Context, try int, err error) bool {
	if !BucketMissing(err) {
		return false
	}
	if try > 0 { // the bucket still seemed to exist a moment ago: give its deletion time
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Duration(try) * 50 * time.Millisecond):
		}
	}
	s.remu.Lock()
	defer s.remu.Unlock()
	if _, _, err = OpenOrCreateKV(ctx, s.js, s.create); err != nil {
		// Right after a deletion JetStream may refuse the new stream while it still removes
		// the old one from disk ("error creating store for stream", 10049): that passes, so
		// the request goes on trying, waiting longer each time, within maxRecreates.
		return ctx.Err() == nil
	}
	return true
}

// OpenOrCreateKV opens the JetStream key-value bucket of cfg, creating it when it does not
// exist (or using the one another writer created at the same moment); created tells whether
// this call created it.
func OpenOrCreateKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (kv jetstream.KeyValue, created bool, err error) {
	kv, err = js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		created = err == nil
		if errors.Is(err, jetstream.ErrBucketExists) {
			// Another edge created it first (with another configuration): use it.
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
	}
	return kv, created, err
}

// BucketMissing reports whether err, from a request on a JetStream key-value bucket, may
// mean that the bucket does not exist: JetStream's "stream not found" (code 10059) in any
// wrapping, or no stream answering a write to its subjects. Callers that create the bucket
// again on it should check first: a false alarm then costs a request.
func BucketMissing(err error) bool {
	if err == nil {
		return false
	}
	for _, target := range []error{jetstream.ErrBucketNotFound, jetstream.ErrStreamNotFound, jetstream.ErrNoStreamResponse,
		nats.ErrBucketNotFound, nats.ErrStreamNotFound, nats.ErrNoResponders} {
		if errors.Is(err, target) {
			return true
		}
	}
	var jerr *jetstream.APIError
	if errors.As(err, &jerr) && jerr.ErrorCode == jetstream.JSErrCodeStreamNotFound {
		return true
	}
	var nerr *nats.APIError
	if errors.As(err, &nerr) && nerr.ErrorCode == nats.JSErrCodeStreamNotFound {
		return true
	}
	return strings.Contains(err.Error(), "stream not found")
}

// lockKey takes the in-process lock of the NATS key nk, waiting until it is free or ctx, the
// call's (callContext), is done.
func (s *Store) lockKey(ctx context.Context, nk string) (unlock func(), err error) {
	s.keysMu.Lock()
	l := s.keys[nk]
	if l == nil {
		l = &keyLock{ch: make(chan struct{}, 1)}
		s.keys[nk] = l
	}
	l.n++
	s.keysMu.Unlock()
	release := func() {
		s.keysMu.Lock()
		if l.n--; l.n == 0 {
			delete(s.keys, nk)
		}
		s.keysMu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// backoff pauses before retry number try (1, 2, …) of an Update: a random time up to a
// bound that doubles from 1ms per retry to maxBackoff, so that racing writers spread out. It
// ends early, with ctx's error, when ctx (the call's: callContext) is done.
func (s *Store) backoff(ctx context.Context, try int) error {
	bound := s.maxBackoff
	if try < 30 && time.Millisecond<<try < bound {
		bound = time.Millisecond << try
	}
	if bound <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(rand.N(bound))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// opError wraps the error of a request about key ("" for the whole bucket) made within ctx,
// the call's (callContext): one that failed because Close cancelled it is store.ErrClosed,
// and one that failed once ctx was done matches ctx's error too, whatever NATS made of it.
func (s *Store) opError(ctx context.Context, op, key string, err error) error {
	what := "NATS bucket " + s.bucket
	if key != "" {
		what = fmt.Sprintf("%q in %s", key, what)
	}
	switch cerr := ctx.Err(); {
	case s.ctx.Err() != nil:
		return fmt.Errorf("store: %s %s: %w", op, what, store.ErrClosed)
	case cerr != nil && !errors.Is(err, cerr):
		return fmt.Errorf("store: %s %s: %w: %w", op, what, cerr, err)
	}
	return fmt.Errorf("store: %s %s: %w", op, what, err)
}

// decode decodes the value stored at the store key key; one that is not a route is
// ErrCorrupt.
func (s *Store) decode(key string, v []byte) (*store.Route, error) {
	r := new(store.Route)
	if err := json.Unmarshal(v, r); err != nil {
		return nil, s.corrupt(fmt.Errorf("the route at key %q does not decode: %w", key, err))
	}
	return r, nil
}

// corrupt is the ErrCorrupt of a bucket holding something that is not a route.
func (s *Store) corrupt(cause error) error {
	return &corruptError{err: cause,
		msg: fmt.Sprintf("NATS bucket %s is corrupt: %v (delete the offending key, or restore the bucket)", s.bucket, cause)}
}

// isConflict reports whether err is JetStream refusing a create-only or update-at-revision
// write because the key changed: code 10071, or 10164 on a replicated stream.
func isConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// natsKeyPlain reports whether c may stand for itself in a token of a NATS key.
func natsKeyPlain(c byte) bool {
	return c == '-' || c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// natsKey returns the NATS key of the store key key (see Store): the kind, and the label if
// there is a '/', each one token, plain or '=' and base64url.
func natsKey(key string) string {
	kind, label, slash := strings.Cut(key, "/")
	if !slash {
		return natsKeyToken(kind)
	}
	return natsKeyToken(kind) + "." + natsKeyToken(label)
}

// natsKeyToken encodes one part of a store key as a token of a NATS key.
func natsKeyToken(part string) string {
	plain := part != ""
	for i := 0; plain && i < len(part); i++ {
		plain = natsKeyPlain(part[i])
	}
	if plain {
		return part
	}
	return "=" + base64.RawURLEncoding.EncodeToString([]byte(part))
}

// storeKey is the inverse of natsKey: it fails on a NATS key that natsKey does not return.
func storeKey(nk string) (string, error) {
	toks := strings.Split(nk, ".")
	if len(toks) > 2 {
		return "", fmt.Errorf("%d tokens, not 1 or 2", len(toks))
	}
	parts := make([]string, len(toks))
	for i, tok := range toks {
		if rest, ok := strings.CutPrefix(tok, "="); ok {
			part, err := base64.RawURLEncoding.Strict().DecodeString(rest)
			if err != nil {
				return "", fmt.Errorf("token %q: %w", tok, err)
			}
			if natsKeyToken(string(part)) != tok {
				return "", fmt.Errorf("token %q: %q needs no encoding", tok, part)
			}
			parts[i] = string(part)
			continue
		}
		if tok == "" {
			return "", errors.New("empty token")
		}
		for j := 0; j < len(tok); j++ {
			if !natsKeyPlain(tok[j]) {
				return "", fmt.Errorf("token %q holds %q", tok, tok[j])
			}
		}
		parts[i] = tok
	}
	return strings.Join(parts, "/"), nil
}
