package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/warren-tunnel/warren/tunnel"
)

// tcpBulkTarget is the target for one stream's throughput, as a fraction of direct.
const tcpBulkTarget = 0.35

// pastTime is a deadline that has passed: setting it unblocks pending I/O at once.
var pastTime = time.Unix(1, 0)

// A stream's bytes are its source buffer repeated. The buffer's length is not a multiple of
// the write size, so that data moved by whole writes would change the checksum.
const (
	sourceLen = 1<<20 + 4093
	writeSize = 256 << 10
)

// streamData is one stream's pseudo-random content and its expected checksum.
type streamData struct {
	src  []byte
	size int64
	crc  uint32
}

func newStreamData(seed uint64, size int64) streamData {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	src := make([]byte, (sourceLen+7)/8*8)
	for i := 0; i < len(src); i += 8 {
		binary.LittleEndian.PutUint64(src[i:], r.Uint64())
	}
	src = src[:sourceLen]
	d := streamData{src: src, size: size}
	d.each(func(p []byte) error { d.crc = crc32.Update(d.crc, castagnoli, p); return nil })
	return d
}

// each calls f with consecutive pieces of the stream, at most writeSize bytes each.
func (d streamData) each(f func([]byte) error) error {
	off := 0
	for left := d.size; left > 0; {
		n := int(min(int64(writeSize), left, int64(len(d.src)-off)))
		if err := f(d.src[off : off+n]); err != nil {
			return err
		}
		left -= int64(n)
		off = (off + n) % len(d.src)
	}
	return nil
}

// sendStream sends d to addr, half-closes, and checks the backend's count and checksum.
// With sized, the stream is hashSizedConn's: its length first, and no half-close.
func sendStream(ctx context.Context, addr string, d streamData, sized bool) error {
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(pastTime) })
	defer stop()
	if sized {
		var head [8]byte
		binary.BigEndian.PutUint64(head[:], uint64(d.size))
		if _, err := c.Write(head[:]); err != nil {
			return fmt.Errorf("sending the length: %w", err)
		}
	}
	if err := d.each(func(p []byte) error { _, err := c.Write(p); return err }); err != nil {
		return fmt.Errorf("sending: %w", err)
	}
	if !sized {
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			return fmt.Errorf("half-closing: %w", err)
		}
	}
	var reply [12]byte
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		return fmt.Errorf("reading the backend's checksum: %w", err)
	}
	n, sum := binary.BigEndian.Uint64(reply[:8]), binary.BigEndian.Uint32(reply[8:])
	if n != uint64(d.size) || sum != d.crc {
		return fmt.Errorf("%w: the backend received %d bytes with CRC-32C %08x; %d bytes with %08x were sent",
			errBadReply, n, sum, d.size, d.crc)
	}
	return nil
}

// bulk sends data[i] to addrs[i] concurrently and returns the aggregate bytes per second.
func bulk(ctx context.Context, addrs []string, data []streamData) (float64, error) {
	return bulkStreams(ctx, addrs, data, false)
}

// bulkStreams is bulk, with sendStream's sized streams when sized is set.
func bulkStreams(ctx context.Context, addrs []string, data []streamData, sized bool) (float64, error) {
	var total int64
	for i := range addrs {
		total += data[i].size
	}
	// A generous bound: 30 s plus 5 MB/s.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+time.Duration(total/5e6)*time.Second)
	defer cancel()
	start := time.Now()
	var g errgroup.Group
	for i, a := range addrs {
		g.Go(func() error { return sendStream(ctx, a, data[i], sized) })
	}
	err := g.Wait()
	return float64(total) / time.Since(start).Seconds(), err
}

// tcpSummary is one bulk workload over the runs.
type tcpSummary struct {
	streams        int
	tunnel, direct series        // aggregate bytes per second per run
	relay          series        // one stream through two plain relays, per run (1 stream only)
	edgeCPU        []float64     // edge CPU seconds per GiB moved, per tunnel run
	verified       int           // streams whose count and checksum matched (both paths)
	elapsed        time.Duration // of the whole workload
	noise          *noise
}

// runTCP measures bulk throughput through a 2-member TCP group and directly.
func (b *bench) runTCP(ctx context.Context, rep *report) error {
	backends, err := startTCPBackends(2, hashConn)
	if err != nil {
		return err
	}
	defer stopTCPBackends(backends)
	e, err := startEdge(ctx, b.cfg.edgeMode, b.edgeOptions("tcp"), b.log, b.progress)
	if err != nil {
		return err
	}
	defer e.Close()
	cs, err := connectGroup(ctx, e, tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: "bulk", GroupKey: "bench"},
		[]string{backends[0].addr(), backends[1].addr()}, b.log)
	if err != nil {
		return err
	}
	defer cs.Close()
	if err := e.waitGroup(ctx, "bulk", 2, 2); err != nil {
		return err
	}
	public := net.JoinHostPort("127.0.0.1", strconv.Itoa(cs.tunnels[0].Port()))

	b.say("tcp: preparing %d streams of %s and their checksums", b.cfg.tcpStreams, fmtBytes(b.cfg.tcpBytes))
	data := make([]streamData, max(1, b.cfg.tcpStreams))
	var g errgroup.Group
	for i := range data {
		g.Go(func() error { data[i] = newStreamData(uint64(i+1), b.cfg.tcpBytes); return nil })
	}
	_ = g.Wait()

	for _, streams := range []int{1, b.cfg.tcpStreams} {
		s := tcpSummary{streams: streams}
		start := time.Now()
		through, direct := make([]string, streams), make([]string, streams)
		for i := range streams {
			through[i], direct[i] = public, backends[i%2].addr()
		}
		var err error
		s.noise, err = b.runPairs(ctx, fmt.Sprintf("tcp %d stream(s)", streams),
			func() (func(), error) {
				cpu0 := e.cpu()
				bps, err := bulk(ctx, through, data[:streams])
				gib := float64(streams) * float64(b.cfg.tcpBytes) / (1 << 30)
				cpu := (e.cpu() - cpu0).Seconds() / gib
				return func() {
					s.tunnel, s.verified, s.edgeCPU = append(s.tunnel, bps), s.verified+streams, append(s.edgeCPU, cpu)
				}, err
			},
			func() (func(), error) {
				bps, err := bulk(ctx, direct, data[:streams])
				return func() { s.direct, s.verified = append(s.direct, bps), s.verified+streams }, err
			})
		if err != nil {
			return err
		}
		if streams == 1 {
			if s.relay, err = b.relayFloor(ctx, e, backends[0].addr(), data[0]); err != nil {
				return err
			}
		}
		s.elapsed = time.Since(start)
		rep.tcp = append(rep.tcp, s)
		if streams == b.cfg.tcpStreams && streams == 1 {
			break
		}
	}
	rep.add(tcpSection(b.cfg, rep.tcp, e.child()))
	return nil
}

// relayChain starts two plain relays in a row to backend, the first in the edge's process
// and the second in this one (where the connectors run), and returns the first's address;
// stop closes the second (the edge closes the first with itself).
func relayChain(ctx context.Context, e *edge, backend string) (addr string, stop func(), err error) {
	r2, err := startTCPBackend(relayConn(backend))
	if err != nil {
		return "", nil, err
	}
	r1, err := e.relay(ctx, r2.addr())
	if err != nil {
		r2.Close()
		return "", nil, fmt.Errorf("starting a relay in the edge's process: %w", err)
	}
	return r1, r2.Close, nil
}

// relayFloor sends one stream -runs times through two plain user-space relays in a row to
// backend, the first in the edge's process and the second in this one (where the connectors
// run): the tunnel's topology and process layout without Warren's multiplexing.
func (b *bench) relayFloor(ctx context.Context, e *edge, backend string, d streamData) (series, error) {
	r1, stop, err := relayChain(ctx, e, backend)
	if err != nil {
		return nil, err
	}
	defer stop()
	var out series
	for r := range b.cfg.runs {
		b.say("tcp 1 stream run %d/%d: two plain relays", r+1, b.cfg.runs)
		bps, err := bulk(ctx, []string{r1}, []streamData{d})
		if err != nil {
			return nil, fmt.Errorf("through two plain relays: %w", err)
		}
		out = append(out, bps)
	}
	return out, nil
}

func tcpSection(cfg *config, ss []tcpSummary, childEdge bool) *section {
	sec := &section{title: fmt.Sprintf("TCP bulk: %s per stream, CRC-32C checked by the backend, median of %d runs", fmtBytes(cfg.tcpBytes), cfg.runs)}
	for _, s := range ss {
		rat := ratio(s.tunnel.median(), s.direct.median())
		r := row{metric: fmt.Sprintf("throughput, %d stream(s)", s.streams), tunnel: fmtMBps(s.tunnel.median()), direct: fmtMBps(s.direct.median()), compare: fmtRatio(rat)}
		if s.streams == 1 {
			r.target, r.result = fmt.Sprintf("≥ %.2f× direct", tcpBulkTarget), check(rat >= tcpBulkTarget)
		}
		sec.add(r)
		if len(s.relay) > 0 {
			sec.add(row{metric: "throughput, 1 stream, two plain relays (no Warren)", tunnel: fmtMBps(s.relay.median()), direct: fmtMBps(s.direct.median()),
				compare: fmtRatio(ratio(s.relay.median(), s.direct.median()))})
		}
		if childEdge && len(s.edgeCPU) > 0 {
			sec.add(row{metric: fmt.Sprintf("edge CPU per GiB, %d stream(s)", s.streams), tunnel: fmt.Sprintf("%.2f s", median(s.edgeCPU))})
		}
	}
	verified, want := 0, 0
	for _, s := range ss {
		verified, want = verified+s.verified, want+2*s.streams*cfg.runs
	}
	sec.add(row{metric: "streams with matching count and checksum", tunnel: fmt.Sprintf("%d of %d (both paths)", verified, want), target: "all", result: check(verified == want)})
	sec.note("tunnel: client → edge's public TCP port of a 2-member TCP group (2 connector sessions) → a backend that hashes what it reads; direct: the same streams to the same 2 backends (stream i to backend i mod 2)")
	sec.note("two plain relays: the client → a relay in the edge's process → a relay in the connectors' process → the backend, each copying through 64 KiB user-space buffers (no splice): the tunnel's three loopback connections and process layout without its multiplexing, for scale")
	for _, s := range ss {
		sec.note("per run, %d stream(s), MB/s: tunnel %s; direct %s", s.streams, s.tunnel.list(fmtMBpsF), s.direct.list(fmtMBpsF))
		if len(s.relay) > 0 {
			sec.note("per run, 1 stream, MB/s, two plain relays: %s", s.relay.list(fmtMBpsF))
		}
		sec.note("%d stream(s): %s", s.streams, s.noise.note())
	}
	return sec
}

// ttfbSummary is the time-to-first-byte workload over the runs: per run, the median and
// p99 of -ttfb-conns sequential connections.
type ttfbSummary struct {
	tunnelMed, tunnelP99, directMed, directP99 series
	failed, total                              int
	noise                                      *noise
}

// runTTFB measures the time from dial to the first byte of new TCP connections, through a
// 2-member TCP group and directly.
func (b *bench) runTTFB(ctx context.Context, rep *report) error {
	backends, err := startTCPBackends(2, oneByteConn)
	if err != nil {
		return err
	}
	defer stopTCPBackends(backends)
	e, err := startEdge(ctx, b.cfg.edgeMode, b.edgeOptions("ttfb"), b.log, b.progress)
	if err != nil {
		return err
	}
	defer e.Close()
	cs, err := connectGroup(ctx, e, tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: "first-byte", GroupKey: "bench"},
		[]string{backends[0].addr(), backends[1].addr()}, b.log)
	if err != nil {
		return err
	}
	defer cs.Close()
	if err := e.waitGroup(ctx, "first-byte", 2, 2); err != nil {
		return err
	}
	public := net.JoinHostPort("127.0.0.1", strconv.Itoa(cs.tunnels[0].Port()))
	s := &ttfbSummary{}
	measure := func(addrs []string, med, p99 *series) runFunc {
		return func() (func(), error) {
			ds := make([]time.Duration, 0, b.cfg.ttfbConns)
			failed := 0
			for i := range b.cfg.ttfbConns {
				d, err := firstByte(ctx, addrs[i%len(addrs)])
				if err != nil {
					if ctx.Err() != nil {
						return nil, ctx.Err()
					}
					failed++
					continue
				}
				ds = append(ds, d)
			}
			sorted := durations(ds)
			return func() {
				s.total, s.failed = s.total+b.cfg.ttfbConns, s.failed+failed
				*med, *p99 = append(*med, float64(percentile(sorted, 0.5))), append(*p99, float64(percentile(sorted, 0.99)))
			}, nil
		}
	}
	s.noise, err = b.runPairs(ctx, "ttfb",
		measure([]string{public}, &s.tunnelMed, &s.tunnelP99),
		measure([]string{backends[0].addr(), backends[1].addr()}, &s.directMed, &s.directP99))
	if err != nil {
		return err
	}
	rep.ttfb = s
	sec := &section{title: fmt.Sprintf("TCP time to first byte: %d sequential new connections per run, median of %d runs", b.cfg.ttfbConns, b.cfg.runs)}
	tm, dm := time.Duration(s.tunnelMed.median()), time.Duration(s.directMed.median())
	tp, dp := time.Duration(s.tunnelP99.median()), time.Duration(s.directP99.median())
	sec.add(row{metric: "dial → first byte, median", tunnel: fmtDur(tm), direct: fmtDur(dm), compare: fmtAdded(tm-dm) + " added"})
	sec.add(row{metric: "dial → first byte, p99", tunnel: fmtDur(tp), direct: fmtDur(dp), compare: fmtAdded(tp-dp) + " added"})
	sec.add(row{metric: "failed connections (all runs, both paths)", tunnel: fmt.Sprintf("%d of %d", s.failed, s.total), target: "0", result: check(s.failed == 0)})
	sec.note("the backend writes one byte on accept; through the tunnel the edge accepts, opens a stream to a member, the connector dials the backend and acknowledges, and only then does the byte flow")
	sec.note("per run, median: tunnel %s; direct %s", s.tunnelMed.list(fmtDurF), s.directMed.list(fmtDurF))
	sec.note("%s", s.noise.note())
	rep.add(sec)
	return nil
}

// firstByte dials addr and returns the time until its first byte arrived.
func firstByte(ctx context.Context, addr string) (time.Duration, error) {
	start := time.Now()
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var one [1]byte
	if _, err := io.ReadFull(c, one[:]); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
