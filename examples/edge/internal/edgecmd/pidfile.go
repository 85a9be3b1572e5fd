// Package edgecmd is the example edge's process plumbing: its listeners, the pid file, the
// "edge reload" command that signals a running edge, the SIGHUP reload and the counted
// drain. The command's main (examples/edge) parses flags, loads the file with package
// tunnel/config and wires these together.
package edgecmd

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// PIDFile is the pid file of a running edge (-pid-file): it holds the process id and a
// newline, written once the edge listens and removed when it exits.
type PIDFile struct{ path string }

// ErrRunning: the pid file names a live edge process.
var ErrRunning = errors.New("an edge is already running")

// CreatePIDFile writes this process's id to path. A file naming a live edge process (not
// this one) is refused with ErrRunning; a stale one (a process that exited, or that is not
// an edge) is replaced, and stale says so.
func CreatePIDFile(path string) (_ *PIDFile, stale string, _ error) {
	if pid, err := readPID(path); err == nil && pid != os.Getpid() {
		if perr := checkEdge(pid); perr == nil {
			return nil, "", fmt.Errorf("pid file %s: %w as process %d (stop it, or give this one another -pid-file)", path, ErrRunning, pid)
		} else {
			stale = fmt.Sprintf("pid file %s named process %d: %v; replacing it", path, pid, perr)
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		stale = fmt.Sprintf("pid file %s: %v; replacing it", path, err)
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".edge-pid-*")
	if err != nil {
		return nil, "", fmt.Errorf("pid file: %w", err)
	}
	_, err = fmt.Fprintf(tmp, "%d\n", os.Getpid())
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return nil, "", fmt.Errorf("pid file: %w", err)
	}
	return &PIDFile{path: path}, stale, nil
}

// Remove deletes the pid file if it still holds this process's id.
func (p *PIDFile) Remove() {
	if p == nil {
		return
	}
	if pid, err := readPID(p.path); err == nil && pid == os.Getpid() {
		_ = os.Remove(p.path)
	}
}

// readPID reads the process id a pid file holds.
func readPID(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s does not hold a process id (%q)", path, bytes.TrimSpace(data))
	}
	return pid, nil
}

// errNotRunning: the pid names no live process.
var errNotRunning = errors.New("no such process is running")

// checkEdge reports why pid is not a running edge, or nil. On Linux the process's
// command line (/proc/PID/cmdline) must name a program whose base name contains "edge"
// (edge, warren-edge, the go run build of examples/edge); elsewhere a live process is
// taken at its word.
func checkEdge(pid int) error {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return errNotRunning
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		if _, serr := os.Stat("/proc/self/cmdline"); serr != nil {
			return nil // no /proc here: cannot tell
		}
		return errNotRunning // it exited in between
	}
	argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if strings.Contains(filepath.Base(argv[0]), "edge") {
		return nil
	}
	return fmt.Errorf("it is not an edge (its command line is %q)", strings.Join(argv, " "))
}

// Reload is "edge reload -pid-file PATH [-config FILE]": it checks FILE as -check does
// (a broken file: its errors, exit 1, nothing sent), then sends SIGHUP to the edge whose
// process id PATH holds, once it has made sure that process is an edge. It returns the
// exit code: 0 sent, 1 not sent, 2 bad usage.
func Reload(args []string, stdout, stderr io.Writer, check func(path string) error) int {
	set := flag.NewFlagSet("edge reload", flag.ContinueOnError)
	set.SetOutput(stderr)
	pidPath := set.String("pid-file", "", "the running edge's pid `file` (its -pid-file); required")
	cfgPath := set.String("config", "", "check this configuration `file` first, as -check does, and send nothing if it has errors")
	set.Usage = func() {
		fmt.Fprintln(stderr, "usage: edge reload -pid-file PATH [-config server.toml]")
		set.PrintDefaults()
	}
	if err := set.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if set.NArg() != 0 || *pidPath == "" {
		set.Usage()
		return 2
	}
	if *cfgPath != "" {
		if err := check(*cfgPath); err != nil {
			fmt.Fprintln(stderr, err)
			fmt.Fprintln(stderr, "edge reload: the file has errors; nothing was sent (the edge keeps its running configuration)")
			return 1
		}
	}
	pid, err := readPID(*pidPath)
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(stderr, "edge reload: no pid file %s: is the edge running with -pid-file %s?\n", *pidPath, *pidPath)
		return 1
	}
	if err != nil {
		fmt.Fprintln(stderr, "edge reload:", err)
		return 1
	}
	if err := checkEdge(pid); errors.Is(err, errNotRunning) {
		fmt.Fprintf(stderr, "edge reload: pid file %s names process %d, which is not running: a stale pid file (the edge is not running)\n", *pidPath, pid)
		return 1
	} else if err != nil {
		fmt.Fprintf(stderr, "edge reload: pid file %s names process %d, but %v; not signalling it\n", *pidPath, pid, err)
		return 1
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		fmt.Fprintf(stderr, "edge reload: signalling process %d: %v\n", pid, err)
		return 1
	}
	fmt.Fprintf(stdout, "sent SIGHUP to edge process %d; its log says what the reload applied\n", pid)
	return 0
}
