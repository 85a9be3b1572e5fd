package tunnel

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// BenchmarkTCPStreamControl measures one TCP stream through a TCP tunnel whose connector's
// control connection is plain TCP ("plain") or TLS ("tls"), side by side in one process:
// edge, connector, client and backend all here, over loopback. The stream goes over a data
// connection (plain or TLS like the control connection). "up" writes 64 KiB chunks from the
// public client to a backend that counts them (the direction of examples/bench's TCP
// stream); "down" has the backend write to the public client. Each op is 64 KiB; the
// timer stops once the receiving end has every byte. Compare the two with benchstat:
//
//	go test -c -o /tmp/tunnel.test ./tunnel
//	for i in 1 2 3 4 5 6; do /tmp/tunnel.test -test.run XXX -test.bench TCPStreamControl -test.benchtime 2s; done | tee out.txt
//	benchstat -col /ctl out.txt
func BenchmarkTCPStreamControl(b *testing.B) {
	plain := startEdge(b, ServerConfig{Logger: zap.NewNop(), TCP: TCPTunnels{Ports: tcpRange(45200), BindHost: "127.0.0.1"}})
	tlsEdge, roots := startTLSControlEdge(b, ServerConfig{Logger: zap.NewNop(), TCP: TCPTunnels{Ports: tcpRange(45250), BindHost: "127.0.0.1"}})
	backend := tcpBackend(b, streamBackend)
	ports := map[string]int{}
	for ctl, dial := range map[string]func() (*Session, error){
		"plain": func() (*Session, error) { return Dial(ctxT(b), plain.controlAddr, WithLogger(zap.NewNop())) },
		"tls": func() (*Session, error) {
			return Dial(ctxT(b), tlsEdge, WithLogger(zap.NewNop()), WithTLS(&tls.Config{RootCAs: roots}))
		},
	} {
		sess, err := dial()
		require.NoError(b, err)
		b.Cleanup(func() { _ = sess.Close() })
		tun, err := sess.Forward(ctxT(b), TunnelSpec{Proto: ProtoTCP}, backend)
		require.NoError(b, err)
		ports[ctl] = tun.Port()
	}
	for _, dir := range []string{"up", "down"} {
		for _, ctl := range []string{"plain", "tls"} {
			b.Run("dir="+dir+"/ctl="+ctl, func(b *testing.B) {
				streamOnce(b, net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[ctl])), dir == "down")
			})
		}
	}
}

const streamChunk = 64 << 10

// streamOnce sends b.N chunks through one new connection to addr, one way.
func streamOnce(b *testing.B, addr string, down bool) {
	c, err := net.Dial("tcp", addr)
	require.NoError(b, err)
	defer c.Close()
	// Wait for the connection to reach the backend (a data connection taken, the backend
	// dialled) before the timer runs: the backend answers one byte.
	var req [9]byte
	if down {
		req[0] = 'D'
	} else {
		req[0] = 'U'
	}
	binary.BigEndian.PutUint64(req[1:], uint64(b.N)*streamChunk)
	_, err = c.Write(req[:])
	require.NoError(b, err)
	_, err = io.ReadFull(c, req[:1])
	require.NoError(b, err)
	b.SetBytes(streamChunk)
	cpu0 := processCPU()
	defer func() {
		// CPU of the whole process (edge, connector, client, backend) per GiB carried: less
		// sensitive than MB/s to other work on a shared machine.
		b.ReportMetric((processCPU()-cpu0).Seconds()/(float64(b.N)*streamChunk/(1<<30)), "cpu-s/GiB")
	}()
	b.ResetTimer()
	if down {
		buf := make([]byte, 256<<10)
		var n int
		for {
			got, err := c.Read(buf)
			n += got
			if err == io.EOF {
				break
			}
			require.NoError(b, err)
		}
		require.Equal(b, b.N*streamChunk, n)
		return
	}
	chunk := make([]byte, streamChunk)
	for range b.N {
		if _, err := c.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	// The backend answers when it has read every byte.
	_, err = io.ReadFull(c, req[:1])
	require.NoError(b, err)
}

// streamBackend serves streamOnce: a direction and a length, one byte back, then the
// length's bytes one way, and one byte back again after an upload.
func streamBackend(c net.Conn) {
	var req [9]byte
	if _, err := io.ReadFull(c, req[:]); err != nil {
		return
	}
	n := int64(binary.BigEndian.Uint64(req[1:]))
	if _, err := c.Write([]byte{1}); err != nil {
		return
	}
	if req[0] == 'D' {
		chunk := make([]byte, streamChunk)
		for ; n > 0; n -= streamChunk {
			if _, err := c.Write(chunk[:min(n, streamChunk)]); err != nil {
				return
			}
		}
		_ = c.(*net.TCPConn).CloseWrite()
		return
	}
	buf := make([]byte, 256<<10) // io.Discard reads 8 KiB at a time: a costly sink
	for n > 0 {
		got, err := c.Read(buf[:min(n, int64(len(buf)))])
		if err != nil {
			return
		}
		n -= int64(got)
	}
	_, _ = c.Write([]byte{1})
}

// startTLSControlEdge starts an edge whose control listener speaks TLS as ListenAndServe's
// does, on loopback, with a throwaway certificate; it returns the control address and the roots that verify it.
func startTLSControlEdge(b *testing.B, cfg ServerConfig) (string, *x509.CertPool) {
	pki := newTestPKI(b)
	if cfg.Domain == "" {
		cfg.Domain = testDomain
	}
	cfg.TLSConfig = &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}
	srv, err := NewServer(cfg)
	require.NoError(b, err)
	l := listenLoopback(b)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(tlsListener{l, srv.cfg.TLSConfig}) }() // as ListenAndServe
	b.Cleanup(func() {
		require.NoError(b, srv.Close())
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			b.Errorf("Serve returned %v", err)
		}
	})
	return l.Addr().String(), pki.pool
}

// BenchmarkIdleTLSTCPConnMemory is BenchmarkIdleTCPConnMemory with TLS control (and so
// TLS data connections): the memory that idle TCP connections through a tunnel hold, edge
// and connector together, per connection. Run it with -benchtime 1x in a fresh process.
func BenchmarkIdleTLSTCPConnMemory(b *testing.B) {
	ctl, roots := startTLSControlEdge(b, ServerConfig{Logger: zap.NewNop(), TCP: TCPTunnels{Ports: tcpRange(45300), BindHost: "127.0.0.1"}})
	sess, err := Dial(ctxT(b), ctl, WithLogger(zap.NewNop()), WithTLS(&tls.Config{RootCAs: roots}))
	require.NoError(b, err)
	b.Cleanup(func() { _ = sess.Close() })
	echo := tcpBackend(b, func(c net.Conn) { _, _ = io.Copy(c, c) })
	tun, err := sess.Forward(ctxT(b), TunnelSpec{Proto: ProtoTCP}, echo)
	require.NoError(b, err)
	measureIdleTCPConns(b, tun.Port())
}
