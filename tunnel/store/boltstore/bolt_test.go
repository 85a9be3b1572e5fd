//go:build unix

package boltstore

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/warren-tunnel/warren/tunnel/store"
	"github.com/warren-tunnel/warren/tunnel/store/storetest"
)

func TestBoltCreatesDirAndFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "state")
	s := mustOpen(t, dir)
	defer s.Close()
	for path, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, filepath.Join(dir, FileName): 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s has mode %v, want %v", path, fi.Mode(), want)
		}
	}
}

func TestBoltReopenKeepsEverything(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	want := map[string]*store.Route{}
	for i := range 100 {
		r := storetest.SampleRoute(fmt.Sprintf("r%03d", i))
		if i%2 == 0 {
			r.Kind, r.Ports = store.KindHTTP, nil
		}
		if _, err := s.Update(t.Context(), r.Key(), storetest.Set(r)); err != nil {
			t.Fatal(err)
		}
		want[r.Key()] = r
	}
	// Modify some, delete some.
	for i := 0; i < 100; i += 3 {
		for k, r := range want {
			if strings.HasSuffix(k, fmt.Sprintf("r%03d", i)) {
				if i%2 == 0 {
					if _, err := s.Update(t.Context(), k, storetest.Set(nil)); err != nil {
						t.Fatal(err)
					}
					delete(want, k)
				} else {
					r.Tenant = "changed"
					if _, err := s.Update(t.Context(), k, storetest.Set(r)); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = mustOpen(t, dir)
	defer s.Close()
	l, err := s.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != len(want) {
		t.Fatalf("after reopen List has %d routes, want %d", len(l), len(want))
	}
	for _, r := range l {
		if !storetest.SameRoute(t, r, want[r.Key()]) {
			t.Fatalf("after reopen %s = %+v, want %+v", r.Key(), r, want[r.Key()])
		}
	}
}

// killEnv names the state directory for the child process of TestBoltKill9; killStartEnv is
// the child's first route number.
const (
	killEnv      = "WARREN_STORE_KILL9_DIR"
	killStartEnv = "WARREN_STORE_KILL9_START"
)

// TestBoltKill9Child is the child process of TestBoltKill9 (it does nothing in a normal run):
// it writes routes, one Update each plus an Update of a counter, and prints "ACK <n>" once
// both have returned, until it is killed.
func TestBoltKill9Child(t *testing.T) {
	dir := os.Getenv(killEnv)
	if dir == "" {
		t.Skip("the child process of TestBoltKill9")
	}
	start, err := strconv.Atoi(os.Getenv(killStartEnv))
	if err != nil {
		fmt.Printf("ERR %v\n", err)
		os.Exit(3)
	}
	s, err := Open(dir)
	if err != nil {
		fmt.Printf("ERR %v\n", err)
		os.Exit(3)
	}
	for i := start; ; i++ {
		r := killRoute(i)
		if _, err := s.Update(t.Context(), r.Key(), storetest.Set(r)); err != nil {
			fmt.Printf("ERR %v\n", err)
			os.Exit(3)
		}
		if _, err := s.Update(t.Context(), store.Key(store.KindTCP, "counter"), func(cur *store.Route) (*store.Route, error) {
			if cur == nil {
				cur = &store.Route{Kind: store.KindTCP, Label: "counter", Ports: map[string]int{}}
			}
			cur.Ports["last"] = i
			return cur, nil
		}); err != nil {
			fmt.Printf("ERR %v\n", err)
			os.Exit(3)
		}
		fmt.Printf("ACK %d\n", i) // one write(2): a line is whole or absent
	}
}

func killRoute(i int) *store.Route {
	return &store.Route{Kind: store.KindTCP, Label: fmt.Sprintf("k%08d", i), Tenant: "t", Ports: map[string]int{"p": i}}
}

// TestBoltKill9 runs a child process that writes routes, SIGKILLs it mid-stream, and checks
// that every route the child saw acknowledged is in the file; three times over one directory.
func TestBoltKill9(t *testing.T) {
	dir := t.TempDir()
	var acked []int
	for round := range 3 {
		start := round * 1_000_000
		got := runAndKill(t, dir, start, 20+round*30)
		acked = append(acked, got...)

		s := mustOpen(t, dir) // also: the file is whole (Open checks it)
		for _, i := range acked {
			want := killRoute(i)
			if r := storetest.MustGet(t, s, want.Key()); !storetest.SameRoute(t, r, want) {
				t.Fatalf("round %d: acknowledged route %d is %+v after kill -9, want %+v", round, i, r, want)
			}
		}
		c := storetest.MustGet(t, s, store.Key(store.KindTCP, "counter"))
		if last := got[len(got)-1]; c == nil || c.Ports["last"] < last {
			t.Fatalf("round %d: counter = %+v after kill -9, want last >= %d", round, c, last)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d routes acknowledged before SIGKILL, all there", round, len(got))
	}
}

// runAndKill starts the child writing routes from start in dir, SIGKILLs it once it has
// acknowledged at least n, and returns every route number it acknowledged (including lines
// still in the pipe when it died).
func runAndKill(t *testing.T, dir string, start, n int) []int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBoltKill9Child$", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), killEnv+"="+dir, killStartEnv+"="+strconv.Itoa(start))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acked []int
	killed := false
	rd := bufio.NewReader(stdout)
	for {
		line, err := rd.ReadString('\n')
		if err != nil { // EOF: the child is gone; a last line without '\n' is not an ack
			if err != io.EOF {
				t.Errorf("reading the child: %v", err)
			}
			break
		}
		line = strings.TrimSuffix(line, "\n")
		if rest, ok := strings.CutPrefix(line, "ACK "); ok {
			i, err := strconv.Atoi(rest)
			if err != nil {
				t.Fatalf("child printed %q", line)
			}
			acked = append(acked, i)
		} else if strings.HasPrefix(line, "ERR ") {
			t.Errorf("child: %s", line)
		}
		if len(acked) >= n && !killed {
			if err := cmd.Process.Kill(); err != nil { // SIGKILL
				t.Fatal(err)
			}
			killed = true
		}
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !killed || !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v after %d acks (killed by us: %v); stderr:\n%s", err, len(acked), killed, stderr.String())
	}
	for j, i := range acked {
		if i != start+j {
			t.Fatalf("child acknowledged %d as its ack number %d, want %d", i, j, start+j)
		}
	}
	return acked
}

func TestBoltLockedDir(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	begin := time.Now()
	s2, err := Open(dir)
	took := time.Since(begin)
	if err == nil {
		s2.Close()
		t.Fatal("a second Open of one directory succeeded")
	}
	want := fmt.Sprintf("store: state directory %s is in use by another edge (warren.db is locked)", dir)
	if !errors.Is(err, ErrLocked) || err.Error() != want {
		t.Fatalf("second Open = %q (ErrLocked: %v), want %q", err, errors.Is(err, ErrLocked), want)
	}
	if took > 2*time.Second {
		t.Fatalf("second Open took %v to fail, want about %v", took, DefaultLockTimeout)
	}
	t.Logf("second Open failed after %v", took.Round(time.Millisecond))

	// A shorter timeout is honoured.
	begin = time.Now()
	if _, err := Open(dir, WithLockTimeout(100*time.Millisecond)); !errors.Is(err, ErrLocked) {
		t.Fatalf("Open with a 100ms timeout = %v, want ErrLocked", err)
	}
	if took := time.Since(begin); took > time.Second {
		t.Fatalf("Open with a 100ms timeout took %v", took)
	}

	// Once the first lets go, the directory opens.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir)
	s.Close()
}

// expectOpenError opens dir and checks it fails with kind (nil: any) and an error naming the
// file and containing each of wants.
func expectOpenError(t *testing.T, dir string, kind error, wants ...string) {
	t.Helper()
	s, err := Open(dir)
	if err == nil {
		s.Close()
		t.Fatal("Open succeeded")
	}
	t.Logf("Open: %v", err)
	if kind != nil && !errors.Is(err, kind) {
		t.Errorf("Open = %v, want errors.Is %v", err, kind)
	}
	for _, w := range append([]string{filepath.Join(dir, FileName)}, wants...) {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Open = %q, want it to mention %q", err, w)
		}
	}
	// A failed Open leaves the file unlocked (even where bbolt panicked with it mapped).
	f, err := os.Open(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Errorf("after a failed Open the file is still locked: %v", err)
	}
}

func TestBoltCorrupt(t *testing.T) {
	t.Run("garbage", func(t *testing.T) {
		dir := t.TempDir()
		junk := make([]byte, 64<<10)
		_, _ = rand.Read(junk)
		if err := os.WriteFile(filepath.Join(dir, FileName), junk, 0o600); err != nil {
			t.Fatal(err)
		}
		expectOpenError(t, dir, ErrCorrupt, "corrupt")
	})
	t.Run("text", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, FileName), []byte("not a database\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		expectOpenError(t, dir, ErrCorrupt, "corrupt")
	})
	for _, keep := range []float64{0.9, 0.5, 0.1} {
		t.Run(fmt.Sprintf("truncated to %.0f%%", keep*100), func(t *testing.T) {
			dir := t.TempDir()
			path := writeDB(t, dir, 2000)
			// Cut into the data itself (the file may be longer, grown ahead of it).
			var size int64
			db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			_ = db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil })
			db.Close()
			if err := os.Truncate(path, int64(float64(size)*keep)); err != nil {
				t.Fatal(err)
			}
			expectOpenError(t, dir, ErrCorrupt, "corrupt")
		})
	}
	t.Run("shorter than its meta pages", func(t *testing.T) {
		dir := t.TempDir()
		path := writeDB(t, dir, 10)
		if err := os.Truncate(path, int64(os.Getpagesize())+100); err != nil {
			t.Fatal(err)
		}
		expectOpenError(t, dir, ErrCorrupt, "corrupt")
	})
	t.Run("garbage pages", func(t *testing.T) {
		// Every page after the two meta pages overwritten: the meta pages are fine, what
		// they point at is not.
		dir := t.TempDir()
		path := writeDB(t, dir, 2000)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		ps := os.Getpagesize()
		_, _ = rand.Read(data[2*ps:])
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		expectOpenError(t, dir, ErrCorrupt, "corrupt")
	})
	t.Run("branch key outside its page", func(t *testing.T) {
		// bbolt's tx.Check would read this key through the map, fault in its own goroutine
		// and kill the process; Open's page validation must catch it first.
		dir := t.TempDir()
		path := writeDB(t, dir, 2000)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		ps := os.Getpagesize()
		found := false
		for pg := 2; (pg+1)*ps <= len(data) && !found; pg++ {
			p := data[pg*ps:]
			if binary.NativeEndian.Uint64(p) == uint64(pg) && binary.NativeEndian.Uint16(p[8:]) == branchPageFlag {
				binary.NativeEndian.PutUint32(p[pageHeaderSize+4:], 1<<30) // element 0's ksize
				found = true
			}
		}
		if !found {
			t.Fatal("no branch page in a file of 2000 routes")
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		expectOpenError(t, dir, ErrCorrupt, "key lies outside the page")
	})
	t.Run("value not JSON", func(t *testing.T) {
		dir := t.TempDir()
		path := writeDB(t, dir, 10)
		rawUpdate(t, path, func(tx *bolt.Tx) error {
			return tx.Bucket(routesBucket).Put([]byte("http/bad"), []byte("{not json"))
		})
		expectOpenError(t, dir, ErrCorrupt, "corrupt", `"http/bad"`, "does not decode")
	})
	t.Run("value not a route", func(t *testing.T) {
		dir := t.TempDir()
		path := writeDB(t, dir, 10)
		rawUpdate(t, path, func(tx *bolt.Tx) error {
			return tx.Bucket(routesBucket).Put([]byte("http/bad"), []byte(`{"key_hash":"zz"}`))
		})
		expectOpenError(t, dir, ErrCorrupt, `"http/bad"`, "does not decode")
	})
	t.Run("not a warren file", func(t *testing.T) {
		dir := t.TempDir()
		rawUpdate(t, filepath.Join(dir, FileName), func(tx *bolt.Tx) error {
			_, err := tx.CreateBucket([]byte("something else"))
			return err
		})
		expectOpenError(t, dir, ErrCorrupt, "not a warren state file")
	})
	t.Run("bad schema version", func(t *testing.T) {
		dir := t.TempDir()
		path := writeDB(t, dir, 1)
		rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(metaBucket).Put(versionKey, []byte("one")) })
		expectOpenError(t, dir, ErrCorrupt, "schema version")
	})
}

func TestBoltNewerSchemaRefused(t *testing.T) {
	dir := t.TempDir()
	path := writeDB(t, dir, 1)
	rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(metaBucket).Put(versionKey, []byte("2")) })
	expectOpenError(t, dir, nil, "schema version 2", "newer than this build", "upgrade warren")
}

func TestBoltDirCannotBeCreated(t *testing.T) {
	parent := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(parent, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "state")
	_, err := Open(dir)
	if err == nil || !strings.Contains(err.Error(), "cannot create state directory "+dir) {
		t.Fatalf("Open under a file = %v, want a cannot-create error naming %s", err, dir)
	}
	if _, err := Open(""); err == nil {
		t.Fatal("Open(\"\") succeeded")
	}
}

func TestBoltDirNotWritable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(dir, 0o700) })
	probe := filepath.Join(dir, "probe")
	if f, err := os.Create(probe); err == nil {
		f.Close()
		os.Remove(probe)
		t.Skip("this process can write a mode-0500 directory (running as root, as in CI): an unwritable state directory cannot be made here")
	}
	_, err := Open(dir)
	if err == nil || !strings.Contains(err.Error(), "cannot open "+filepath.Join(dir, FileName)) || !errors.Is(err, os.ErrPermission) {
		t.Fatalf("Open of a read-only directory = %v, want a permission error naming the file", err)
	}
	t.Logf("Open: %v", err)
}

// TestBoltUpdateReturnsStoredForm checks Update's result is the route as stored (as Get
// returns it), e.g. with no monotonic clock reading.
func TestBoltUpdateReturnsStoredForm(t *testing.T) {
	s := mustOpen(t, t.TempDir())
	defer s.Close()
	r := &store.Route{Kind: store.KindHTTP, Label: "a", EmptySince: time.Now()}
	got, err := s.Update(t.Context(), r.Key(), storetest.Set(r))
	if err != nil {
		t.Fatal(err)
	}
	again := storetest.MustGet(t, s, r.Key())
	if got.EmptySince != again.EmptySince || !got.EmptySince.Equal(r.EmptySince) {
		t.Fatalf("Update returned %v, Get %v, stored %v", got.EmptySince, again.EmptySince, r.EmptySince)
	}
}

// TestBoltCorruptSweep damages a store's file in many seeded ways — bytes flipped, a page of
// garbage, a page zeroed, the file cut short — and opens each: Open must either succeed
// (the damage hit unused space) with every route readable, or fail with ErrCorrupt naming
// the file; never crash the process (a fault in bbolt's check goroutine would) or hang.
// WARREN_STORE_SWEEP=N runs N cases instead of the default.
func TestBoltCorruptSweep(t *testing.T) {
	n := 120
	if testing.Short() {
		n = 20
	}
	if v, err := strconv.Atoi(os.Getenv("WARREN_STORE_SWEEP")); err == nil {
		n = v
	}
	base := t.TempDir()
	orig, err := os.ReadFile(writeDB(t, base, 1000))
	if err != nil {
		t.Fatal(err)
	}
	ps := os.Getpagesize()
	outcomes := map[string]int{}
	for i := range n {
		rng := mrand.New(mrand.NewPCG(uint64(i), 1))
		data := append([]byte(nil), orig...)
		var how string
		switch i % 4 {
		case 0:
			flips := 1 + rng.IntN(20)
			for range flips {
				data[rng.IntN(len(data))] ^= byte(1 + rng.IntN(255))
			}
			how = fmt.Sprintf("%d bytes changed", flips)
		case 1:
			pg := rng.IntN(len(data) / ps)
			for j := pg * ps; j < (pg+1)*ps; j++ {
				data[j] = byte(rng.Uint32())
			}
			how = fmt.Sprintf("page %d garbage", pg)
		case 2:
			pg := rng.IntN(len(data) / ps)
			clear(data[pg*ps : (pg+1)*ps])
			how = fmt.Sprintf("page %d zeroed", pg)
		case 3:
			data = data[:rng.IntN(len(data))]
			how = fmt.Sprintf("cut to %d bytes", len(data))
		}
		dir := filepath.Join(base, strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, FileName), data, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir)
		switch {
		case err == nil:
			if _, err := s.List(t.Context()); err != nil {
				t.Errorf("case %d (%s): Open succeeded, then List = %v", i, how, err)
			}
			if err := s.Close(); err != nil {
				t.Errorf("case %d (%s): Close = %v", i, how, err)
			}
			outcomes["opened"]++
		case errors.Is(err, ErrCorrupt) && strings.Contains(err.Error(), filepath.Join(dir, FileName)):
			outcomes["ErrCorrupt"]++
		default:
			t.Errorf("case %d (%s): Open = %v, want success or ErrCorrupt naming the file", i, how, err)
		}
		_ = os.RemoveAll(dir)
	}
	t.Logf("%d damaged files: %v", n, outcomes)
}
