//go:build linux

package wan

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	nfqueue "github.com/florianl/go-nfqueue/v2"
	"golang.org/x/sys/unix"
)

const (
	// maxQueueLen bounds the packets held at once, in the kernel and in the scheduler.
	// A 50 ms RTT link at 1 GiB/s keeps ~25 MiB in flight per direction: with loopback's
	// 64 KiB segments that is a few hundred packets; small-packet workloads (many HTTP
	// clients) need more, and 16384 is far beyond what two cores can push in 25 ms.
	maxQueueLen = 16384
	// readBuffer is the netlink socket's receive buffer. Only metadata is copied (no
	// payload), a few hundred bytes per packet, so this holds bursts of tens of
	// thousands of packets; a packet that still does not fit is dropped and counted.
	readBuffer = 32 << 20
	// maxConsecutiveReadErrors ends the reader when the socket keeps failing without a
	// packet in between (it would spin otherwise); stop then reports it.
	maxConsecutiveReadErrors = 1000
)

var queueCounter atomic.Uint32

// delayer is one running Delay: its queue, its rules and its scheduler.
type delayer struct {
	port     int
	queueNum uint16
	iptables string
	nf       *nfqueue.Nfqueue
	sched    *scheduler

	readErrs  atomic.Uint64
	readFatal atomic.Pointer[error]
	closing   atomic.Bool

	stopOnce  sync.Once
	stopErr   error
	final     stats
	unhookCtx func() bool
}

// nfVerdicter gives verdicts through the queue's netlink socket.
type nfVerdicter struct{ nf *nfqueue.Nfqueue }

func (v nfVerdicter) acceptUpTo(lastID uint32) error {
	return v.nf.SetVerdictBatch(lastID, nfqueue.NfAccept)
}

func (v nfVerdicter) drop(id uint32) error { return v.nf.SetVerdict(id, nfqueue.NfDrop) }

// rules returns the iptables rule specs (without -A/-D) sending the port's packets, TCP
// and UDP (QUIC transports), both directions, on lo to the queue. INPUT sees every packet once after it crossed lo, and
// there it no longer counts against the sending socket, so holding it does not throttle
// the sender beyond what the delay itself does.
func (d *delayer) rules() [][]string {
	q := strconv.Itoa(int(d.queueNum))
	p := strconv.Itoa(d.port)
	var out [][]string
	for _, proto := range []string{"tcp", "udp"} {
		out = append(out,
			[]string{"INPUT", "-i", "lo", "-p", proto, "--dport", p, "-j", "NFQUEUE", "--queue-num", q},
			[]string{"INPUT", "-i", "lo", "-p", proto, "--sport", p, "-j", "NFQUEUE", "--queue-num", q})
	}
	return out
}

func iptablesRun(ctx context.Context, bin, op string, rule []string) error {
	args := append([]string{"-w", "5", op}, rule...)
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("wan: %s %s: %w: %s", bin, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

func startDelay(ctx context.Context, port int, oneWay time.Duration, loss float64) (*delayer, error) {
	if err := validateDelay(port, oneWay, loss); err != nil {
		return nil, err
	}
	if !InNamespace() {
		return nil, ErrNotInNamespace
	}
	bins := iptablesCandidates()
	if len(bins) == 0 {
		return nil, errors.New("wan: iptables is not installed (Debian: apt-get install -y iptables)")
	}
	d := &delayer{port: port}
	if err := d.openQueue(ctx, oneWay, loss); err != nil {
		return nil, err
	}
	// The queue is bound before any rule points at it, so no packet finds it unbound.
	var errs []error
	for _, bin := range bins {
		err := d.addRules(ctx, bin)
		if err == nil {
			d.iptables = bin
			break
		}
		errs = append(errs, err)
	}
	if d.iptables == "" {
		d.closeQueue()
		return nil, errors.Join(errs...)
	}
	d.unhookCtx = context.AfterFunc(ctx, func() { _ = d.stop() })
	return d, nil
}

func (d *delayer) setLoss(loss float64) { d.sched.setLoss(loss) }

// Stop is the stop function Delay hands out: it also forgets ctx.
func (d *delayer) Stop() error {
	d.unhookCtx()
	return d.stop()
}

// openQueue binds a free queue number in this namespace and starts the reader and the
// scheduler.
func (d *delayer) openQueue(ctx context.Context, oneWay time.Duration, loss float64) error {
	var errs []error
	for try := 0; try < 16; try++ {
		num := uint16(100 + (os.Getpid()*31+int(queueCounter.Add(1)))%60000)
		nf, err := nfqueue.Open(&nfqueue.Config{
			NfQueue:      num,
			MaxQueueLen:  maxQueueLen,
			Copymode:     nfqueue.NfQnlCopyMeta,
			Flags:        nfqueue.NfQaCfgFlagGSO, // no fail-open: a full queue drops
			AfFamily:     unix.AF_INET,
			WriteTimeout: time.Second,
		})
		if err != nil {
			return fmt.Errorf("wan: open nfqueue: %w", err)
		}
		if err := setReadBuffer(nf); err != nil {
			_ = nf.Close()
			return err
		}
		d.nf, d.queueNum = nf, num
		d.sched = newScheduler(oneWay, loss, maxQueueLen, nfVerdicter{nf}, uint64(time.Now().UnixNano()))
		// The reader's context is not ctx: cancelling ctx stops everything through stop.
		err = nf.RegisterWithErrorFunc(context.Background(), d.onPacket, d.onError)
		if err == nil {
			go d.sched.run()
			return nil
		}
		_ = nf.Close()
		errs = append(errs, fmt.Errorf("wan: bind nfqueue %d: %w", num, err))
		if ctx.Err() != nil {
			break
		}
	}
	return errors.Join(errs...)
}

// setReadBuffer makes the netlink socket's receive buffer large (SO_RCVBUFFORCE: root
// may pass net.core.rmem_max).
func setReadBuffer(nf *nfqueue.Nfqueue) error {
	rc, err := nf.Con.SyscallConn()
	if err != nil {
		return fmt.Errorf("wan: nfqueue socket: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, readBuffer)
	}); err != nil {
		return fmt.Errorf("wan: nfqueue socket: %w", err)
	}
	if serr != nil {
		if err := nf.Con.SetReadBuffer(readBuffer); err != nil {
			return fmt.Errorf("wan: nfqueue receive buffer: %w", errors.Join(serr, err))
		}
	}
	return nil
}

func (d *delayer) onPacket(a nfqueue.Attribute) int {
	if a.PacketID == nil {
		return 0
	}
	d.readErrs.Store(0)
	d.sched.add(*a.PacketID, time.Now())
	return 0
}

// onError decides whether the reader goes on after a failed read: it ends on close and
// after many failures in a row, and goes on after a full receive buffer (ENOBUFS: the
// kernel dropped packets and counts them) or a refused verdict.
func (d *delayer) onError(err error) int {
	if d.closing.Load() || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.EBADF) {
		return 1
	}
	if n := d.readErrs.Add(1); n >= maxConsecutiveReadErrors {
		ferr := fmt.Errorf("wan: nfqueue reader gave up after %d errors in a row: %w", n, err)
		d.readFatal.Store(&ferr)
		return 1
	}
	return 0
}

func (d *delayer) addRules(ctx context.Context, bin string) error {
	for i, r := range d.rules() {
		if err := iptablesRun(ctx, bin, "-A", r); err != nil {
			for _, done := range d.rules()[:i] {
				_ = iptablesRun(context.Background(), bin, "-D", done)
			}
			return err
		}
	}
	return nil
}

func (d *delayer) removeRules() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	for _, r := range d.rules() {
		errs = append(errs, iptablesRun(ctx, d.iptables, "-D", r))
	}
	return errors.Join(errs...)
}

// closeQueue stops the scheduler (releasing what it holds) and closes the socket, which
// also ends the library's reader goroutines.
func (d *delayer) closeQueue() {
	d.sched.stop()
	d.closing.Store(true)
	_ = d.nf.Close()
}

// stop removes the rules, releases the held packets, reads the kernel's drop counts and
// closes the queue.
func (d *delayer) stop() error {
	d.stopOnce.Do(func() {
		var errs []error
		errs = append(errs, d.removeRules())
		d.sched.stop()
		d.final = d.sched.snapshot()
		kd, kud, err := kernelDrops(d.queueNum)
		errs = append(errs, err)
		d.final.KernelDropped, d.final.KernelUserDropped = kd, kud
		d.closing.Store(true)
		_ = d.nf.Close()
		if p := d.readFatal.Load(); p != nil {
			errs = append(errs, *p)
		}
		if n := d.final.unwanted(); n > 0 {
			errs = append(errs, fmt.Errorf("%w: %d on port %d (%+v)", ErrDropped, n, d.port, d.final))
		}
		if d.final.LateMax > LateTolerance {
			errs = append(errs, fmt.Errorf("%w: up to %v past the %v delay on port %d (%d of %d releases more than 1 ms late)",
				ErrLate, d.final.LateMax.Round(time.Microsecond), d.sched.oneWay, d.port, d.final.Late1ms, d.final.Releases))
		}
		d.stopErr = errors.Join(errs...)
	})
	return d.stopErr
}

// kernelDrops reads nfnetlink_queue's drop counters for one queue of this namespace.
// Columns: queue, portid, waiting, copy mode, copy range, queue_dropped,
// queue_user_dropped, last id, 1.
func kernelDrops(queue uint16) (dropped, userDropped uint64, err error) {
	f, err := os.Open("/proc/net/netfilter/nfnetlink_queue")
	if err != nil {
		return 0, 0, fmt.Errorf("wan: queue statistics: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 7 || fields[0] != strconv.Itoa(int(queue)) {
			continue
		}
		dropped, err1 := strconv.ParseUint(fields[5], 10, 64)
		userDropped, err2 := strconv.ParseUint(fields[6], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return 0, 0, fmt.Errorf("wan: queue statistics %q: %w", sc.Text(), err)
		}
		return dropped, userDropped, nil
	}
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("wan: queue statistics: %w", err)
	}
	return 0, 0, fmt.Errorf("wan: queue %d not listed in nfnetlink_queue", queue)
}

// probeNFQueue checks, in a namespace of its own, that an NFQUEUE rule can be added and
// a queue bound.
func probeNFQueue() (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	name, del, err := newNamespace(ctx)
	if err != nil {
		return fmt.Errorf("wan: cannot create a network namespace: %w", err)
	}
	defer func() {
		if derr := del(); derr != nil {
			err = errors.Join(err, derr)
		}
	}()
	rule := []string{"INPUT", "-i", "lo", "-p", "tcp", "--dport", "9", "-j", "NFQUEUE", "--queue-num", "9"}
	var errs []error
	added := false
	for _, bin := range iptablesCandidates() {
		out, rerr := exec.CommandContext(ctx, ipPath(), append([]string{"netns", "exec", name, bin, "-w", "5", "-A"}, rule...)...).CombinedOutput()
		if rerr == nil {
			added = true
			break
		}
		errs = append(errs, fmt.Errorf("%s: %w: %s", bin, rerr, bytes.TrimSpace(out)))
	}
	if !added {
		return fmt.Errorf("wan: iptables cannot add an NFQUEUE rule: %w", errors.Join(errs...))
	}
	fd, err := unix.Open(netnsDir+"/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("wan: open namespace %s: %w", name, err)
	}
	defer unix.Close(fd)
	nf, err := nfqueue.Open(&nfqueue.Config{NetNS: fd, NfQueue: 9, Copymode: nfqueue.NfQnlCopyMeta, AfFamily: unix.AF_INET})
	if err != nil {
		return fmt.Errorf("wan: NFQUEUE unavailable (nfnetlink_queue): %w", err)
	}
	var closing atomic.Bool
	err = nf.RegisterWithErrorFunc(ctx, func(nfqueue.Attribute) int { return 0 }, func(error) int {
		if closing.Load() {
			return 1
		}
		return 0
	})
	closing.Store(true)
	cerr := nf.Close()
	if err != nil {
		return fmt.Errorf("wan: NFQUEUE unavailable (bind): %w", err)
	}
	if cerr != nil && !errors.Is(cerr, net.ErrClosed) {
		return fmt.Errorf("wan: NFQUEUE close: %w", cerr)
	}
	return nil
}
