// Package boltstore is a route store (store.Store) in one embedded bbolt database file,
// <state dir>/warren.db: the durable store of a single edge. Open it with Open and pass it to
// the edge as tunnel.ServerConfig.Store; the edge closes it.
//
// # Why bbolt
//
// The store keeps the routes in one file through go.etcd.io/bbolt:
//
//   - it is pure Go (no cgo, no server to run): the edge stays one static binary;
//   - the state is one file, easy to back up, move aside or inspect;
//   - every Update is one ACID read-write transaction, serialised with every other, and
//     bbolt fsyncs the file on commit, so a change Update reports done survives kill -9 and
//     power loss (the store never turns bbolt's NoSync on);
//   - bbolt takes an exclusive file lock (flock) on open, so two edges cannot share one
//     state directory: the second Open fails with ErrLocked instead of corrupting the file.
//
// Open checks the whole file before it returns (bbolt's consistency check, and every stored
// route must decode), so a damaged file is reported once, at start, as ErrCorrupt naming the
// file, rather than surfacing later as a wrong answer.
package boltstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/warren-tunnel/warren/tunnel/store"
)

// FileName is the name of the store's database file inside the state directory.
const FileName = "warren.db"

// SchemaVersion is the layout of warren.db that this build writes. Open refuses a file with a
// newer version (a newer warren wrote it), so that an older build never misreads it.
const SchemaVersion = 1

// DefaultLockTimeout is how long Open waits for warren.db's lock before it reports ErrLocked.
const DefaultLockTimeout = time.Second

// Bucket and key names inside warren.db.
var (
	routesBucket = []byte("routes") // store key → JSON-encoded store.Route
	metaBucket   = []byte("meta")   // versionKey → decimal SchemaVersion
	versionKey   = []byte("schema_version")
)

// ErrLocked is the error (matched with errors.Is) of an Open whose state directory another
// edge — another process, or another Open in this process — holds open.
var ErrLocked = errors.New("store: state directory is in use by another edge")

// ErrCorrupt is the error (matched with errors.Is) of an Open, or of a later call, that found
// warren.db damaged: not a bbolt file, truncated, with a broken page structure, failing
// bbolt's consistency check, or holding a route that does not decode. The error's text names
// the file.
var ErrCorrupt = errors.New("store: state file is corrupt")

// fileError is an error of Open or of a read that errors.Is matches to kind (ErrLocked or
// ErrCorrupt) while its text says which directory or file and why.
type fileError struct {
	kind error
	msg  string // what follows "store: "
	err  error  // the cause, if any
}

func (e *fileError) Error() string        { return "store: " + e.msg }
func (e *fileError) Is(target error) bool { return target == e.kind }
func (e *fileError) Unwrap() error        { return e.err }

func lockedError(dir string) error {
	return &fileError{kind: ErrLocked, err: berrors.ErrTimeout,
		msg: fmt.Sprintf("state directory %s is in use by another edge (%s is locked)", dir, FileName)}
}

func corruptError(path string, cause error) error {
	return &fileError{kind: ErrCorrupt, err: cause,
		msg: fmt.Sprintf("%s is corrupt: %v (move it aside to start with no routes, or restore it from a backup)", path, cause)}
}

// Option configures Open.
type Option func(*openOptions)

type openOptions struct {
	lockTimeout time.Duration
}

// WithLockTimeout sets how long Open waits for another holder of warren.db to let go before
// it fails with ErrLocked. The default is DefaultLockTimeout; d <= 0 means the default.
func WithLockTimeout(d time.Duration) Option {
	return func(o *openOptions) {
		if d > 0 {
			o.lockTimeout = d
		}
	}
}

// Store is a store.Store in one bbolt database file, <dir>/warren.db. Every Update is one
// serialisable read-write transaction, fsynced to disk before Update returns; reads run in
// read-only transactions concurrently with it. Routes are stored JSON-encoded under the keys
// Update was given, so List returns them in key (byte) order.
//
// The context a call takes is checked once, before its transaction begins: bbolt cannot
// interrupt a transaction, so a call that has begun one runs to its end, an Update's commit
// and fsync included, and an Update waiting for the one before it to commit waits on.
//
// Open it with Open; it is safe for concurrent use, and Close releases the file (and its
// lock) for the next edge.
type Store struct {
	// mu is held shared by every call for its whole length and exclusively by Close, so that
	// Close waits for calls in flight and no call starts on a closed database.
	mu     sync.RWMutex
	db     *bolt.DB
	path   string
	closed bool
}

var _ store.Store = (*Store)(nil)

// Open opens the store in the state directory dir: it creates dir (mode 0700) if it does
// not exist and the file dir/warren.db (mode 0600) if that does not exist, then checks the
// file whole before it returns.
//
// Open fails, with an error that names the directory or the file:
//   - with ErrLocked if another edge holds the file open, once the lock timeout (see
//     WithLockTimeout) has passed;
//   - with ErrCorrupt if the file is damaged: not a bbolt database, truncated, with a broken
//     page structure, failing bbolt's consistency check (tx.Check), or holding a value that
//     is not a route;
//   - if the file's schema version is newer than SchemaVersion;
//   - if dir cannot be created, or dir or the file cannot be written.
//
// Only one Store may be open on a directory at a time, in any process.
func Open(dir string, opts ...Option) (*Store, error) {
	o := openOptions{lockTimeout: DefaultLockTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	if dir == "" {
		return nil, errors.New("store: no state directory given")
	}
	_, statErr := os.Stat(dir)
	dirCreated := errors.Is(statErr, fs.ErrNotExist)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: cannot create state directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, FileName)
	_, statErr = os.Lstat(path)
	created := errors.Is(statErr, fs.ErrNotExist)

	db, err := openDB(dir, path, o)
	if err != nil {
		return nil, err
	}
	if err := prepare(db, path); err != nil {
		_ = db.Close()
		return nil, err
	}
	// A new file's directory entry (and a new directory's, in its parent) must reach the
	// disk too, or a power loss could lose the whole file after Updates that reported done.
	var syncErr error
	if created {
		syncErr = syncDir(dir)
	}
	if dirCreated && syncErr == nil {
		syncErr = syncDir(filepath.Dir(filepath.Clean(dir)))
	}
	if syncErr != nil {
		_ = db.Close()
		return nil, fmt.Errorf("store: sync state directory %s: %w", dir, syncErr)
	}
	return &Store{db: db, path: path}, nil
}

// openDB opens (creating if need be) and locks the bbolt file, turning bbolt's errors — and
// its panics on some damaged files — into the package's.
func openDB(dir, path string, o openOptions) (db *bolt.DB, err error) {
	var file *os.File // as bbolt opened it, to release it if bbolt panics
	defer func() {
		if p := recover(); p != nil {
			if file != nil {
				// bbolt may have mapped the file, and a mapping keeps the lock held after the
				// descriptor is closed: drop the lock itself first.
				unlockFile(file)
				_ = file.Close()
			}
			db, err = nil, corruptError(path, fmt.Errorf("unreadable (bbolt panicked: %v)", p))
		}
	}()
	// A page bbolt reads past the end of a truncated file faults (SIGBUS); make the fault a
	// panic, recovered above, instead of a crash.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))

	db, err = bolt.Open(path, 0o600, &bolt.Options{
		Timeout: o.lockTimeout,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			file = f
			return f, err
		},
	})
	switch {
	case err == nil:
		return db, nil
	case errors.Is(err, berrors.ErrTimeout):
		return nil, lockedError(dir)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrVersionMismatch),
		errors.Is(err, berrors.ErrChecksum),
		// bbolt has no error value for a file shorter than its two meta pages, only this text
		// (TestBoltCorruptSweep notices if that changes).
		strings.Contains(err.Error(), "file size too small"):
		return nil, corruptError(path, err)
	case errors.Is(err, fs.ErrPermission):
		return nil, fmt.Errorf("store: cannot open %s for writing (the edge must be able to write its state directory): %w", path, err)
	default:
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
}

// prepare checks an opened file whole — its size, its schema version, every route, and
// bbolt's own consistency check — and sets up a new one.
func prepare(db *bolt.DB, path string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = corruptError(path, fmt.Errorf("unreadable (bbolt panicked: %v)", p))
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))

	fresh := false
	err = db.View(func(tx *bolt.Tx) error {
		// A truncated file: its pages would lie past its end, and reading them faults.
		fi, err := os.Stat(path)
		if err != nil {
			return fmt.Errorf("store: stat %s: %w", path, err)
		}
		if fi.Size() < tx.Size() {
			return corruptError(path, fmt.Errorf("truncated: %d bytes, but its pages need %d", fi.Size(), tx.Size()))
		}
		// The page structure, read from the file, before anything walks it through the map.
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("store: open %s: %w", path, err)
		}
		defer f.Close()
		pageSize := tx.DB().Info().PageSize
		if err := validatePages(f, pageSize, uint64(tx.Size())/uint64(pageSize), uint64(tx.Cursor().Bucket().RootPage())); err != nil {
			return corruptError(path, err)
		}
		meta, routes := tx.Bucket(metaBucket), tx.Bucket(routesBucket)
		if meta == nil {
			empty := true
			_ = tx.ForEach(func([]byte, *bolt.Bucket) error { empty = false; return nil })
			if !empty {
				return corruptError(path, errors.New("it has no meta bucket: not a warren state file"))
			}
			fresh = true
		} else {
			raw := meta.Get(versionKey)
			v, err := strconv.Atoi(string(raw))
			if err != nil || v < 1 {
				return corruptError(path, fmt.Errorf("bad schema version %q", raw))
			}
			if v > SchemaVersion {
				return fmt.Errorf("store: %s has schema version %d, newer than this build of warren reads (%d): upgrade warren", path, v, SchemaVersion)
			}
			if routes == nil {
				return corruptError(path, errors.New("it has no routes bucket"))
			}
			if err := routes.ForEach(func(k, v []byte) error {
				_, err := decodeRoute(path, k, v)
				return err
			}); err != nil {
				return err
			}
		}
		// Last, on a page structure known sound (validatePages): bbolt's own check of the
		// whole file (page references, the freelist, key order).
		return checkTx(path, tx)
	})
	if err != nil || !fresh {
		return err
	}
	return db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucket(routesBucket); err != nil {
			return fmt.Errorf("store: set up %s: %w", path, err)
		}
		meta, err := tx.CreateBucket(metaBucket)
		if err != nil {
			return fmt.Errorf("store: set up %s: %w", path, err)
		}
		if err := meta.Put(versionKey, []byte(strconv.Itoa(SchemaVersion))); err != nil {
			return fmt.Errorf("store: set up %s: %w", path, err)
		}
		return nil
	})
}

// checkTx runs bbolt's consistency check on the whole file, reading every error it reports
// (so that its goroutine ends).
func checkTx(path string, tx *bolt.Tx) error {
	var first error
	n := 0
	for err := range tx.Check() {
		if first == nil {
			first = err
		}
		n++
	}
	switch {
	case n == 0:
		return nil
	case n == 1:
		return corruptError(path, fmt.Errorf("consistency check: %w", first))
	default:
		return corruptError(path, fmt.Errorf("consistency check: %w (and %d more problems)", first, n-1))
	}
}

// decodeRoute decodes the value stored at key k; a value that is not a route is ErrCorrupt.
func decodeRoute(path string, k, v []byte) (*store.Route, error) {
	if v == nil {
		return nil, corruptError(path, fmt.Errorf("key %q holds a bucket, not a route", k))
	}
	r := new(store.Route)
	if err := json.Unmarshal(v, r); err != nil {
		return nil, corruptError(path, fmt.Errorf("the route at key %q does not decode: %w", k, err))
	}
	return r, nil
}

// errUnchanged rolls back an Update whose fn changed nothing, so that it costs no write.
var errUnchanged = errors.New("store: unchanged")

// Update implements store.Store: it runs in one bbolt read-write transaction (serialised
// with every other Update) that is on disk when Update returns. fn is called exactly once,
// with a freshly decoded copy of the stored route; it must not call the store (that would
// deadlock).
// An Update that changes nothing (fn returns the route as stored, or nil for an absent key)
// writes nothing.
func (b *Store) Update(ctx context.Context, key string, fn func(cur *store.Route) (*store.Route, error)) (*store.Route, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, store.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("store: update %q in %s: %w", key, b.path, err)
	}
	var (
		out   *store.Route
		fnErr error
	)
	err := b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(routesBucket)
		var cur *store.Route
		old := bk.Get([]byte(key))
		if old != nil {
			var err error
			if cur, err = decodeRoute(b.path, []byte(key), old); err != nil {
				return err
			}
		}
		next, err := fn(cur)
		if err != nil {
			fnErr = err
			return err
		}
		if next == nil {
			if old == nil {
				return errUnchanged
			}
			return bk.Delete([]byte(key))
		}
		data, err := json.Marshal(next)
		if err != nil {
			return fmt.Errorf("store: encode route %q: %w", key, err)
		}
		// What Update returns is what the store now holds: the route as it decodes.
		if out, err = decodeRoute(b.path, []byte(key), data); err != nil {
			return err
		}
		if bytes.Equal(data, old) {
			return errUnchanged
		}
		return bk.Put([]byte(key), data)
	})
	switch {
	case err == nil, errors.Is(err, errUnchanged):
		return out, nil
	case fnErr != nil && err == fnErr:
		return nil, fnErr
	case errors.Is(err, ErrCorrupt):
		return nil, err
	default:
		return nil, fmt.Errorf("store: update %q in %s: %w", key, b.path, err)
	}
}

// Get implements store.Store: it reads in a read-only transaction, which sees the last
// Update that returned and runs concurrently with Updates.
func (b *Store) Get(ctx context.Context, key string) (*store.Route, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, store.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("store: get %q in %s: %w", key, b.path, err)
	}
	var out *store.Route
	err := b.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(routesBucket).Get([]byte(key))
		if v == nil {
			return nil
		}
		var err error
		out, err = decodeRoute(b.path, []byte(key), v)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// List implements store.Store: every route, in key (byte) order, from one read-only
// transaction.
func (b *Store) List(ctx context.Context) ([]*store.Route, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, store.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("store: list %s: %w", b.path, err)
	}
	var out []*store.Route
	err := b.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(routesBucket).ForEach(func(k, v []byte) error {
			r, err := decodeRoute(b.path, k, v)
			if err != nil {
				return err
			}
			out = append(out, r)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Close implements store.Store: it waits for calls in flight, then closes the file and
// releases its lock. Closing again does nothing and returns nil.
func (b *Store) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	if err := b.db.Close(); err != nil {
		return fmt.Errorf("store: close %s: %w", b.path, err)
	}
	return nil
}

// syncDir fsyncs a directory, making the entries created in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
