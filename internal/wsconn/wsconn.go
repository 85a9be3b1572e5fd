// Package wsconn carries a byte stream over a WebSocket (RFC 6455): the connector's
// connection to the edge's public HTTPS listener. It is the part of the protocol Warren uses
// and no more: the HTTP/1.1 upgrade on both sides, binary frames (any data frame's payload
// is stream bytes; message boundaries mean nothing), ping answered with pong, close read as
// the end of the stream. No extensions (no compression), no subprotocols, no text API.
//
// It exists instead of a general WebSocket library because the connector-only program has a
// size bound (examples/backend): github.com/coder/websocket's client links net/http's
// client (Transport, the HTTP/2 bundle) and compress/flate, +0.88 MB; this package adds
// what the connector did not link yet, a few kilobytes.
package wsconn

import (
	"bufio"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The opcodes of RFC 6455 section 5.2.
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xA
)

// maxFrame bounds the payload of one frame Write sends; a longer write is several frames.
const maxFrame = 32 << 10

// acceptGUID is RFC 6455's magic for Sec-WebSocket-Accept.
const acceptGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// ErrProtocol is the error of a peer that broke the WebSocket framing.
var ErrProtocol = errors.New("wsconn: WebSocket protocol violation")

func acceptKey(key string) string {
	h := sha1.Sum([]byte(key + acceptGUID))
	return base64.StdEncoding.EncodeToString(h[:])
}

// headerHas reports whether the comma-separated header h of r names token (any case).
func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), token) {
				return true
			}
		}
	}
	return false
}

// IsUpgrade reports whether r asks for a WebSocket (an HTTP/1.1 GET with Connection:
// Upgrade and Upgrade: websocket).
func IsUpgrade(r *http.Request) bool {
	return r.Method == http.MethodGet && r.ProtoAtLeast(1, 1) &&
		headerHas(r.Header, "Connection", "upgrade") && headerHas(r.Header, "Upgrade", "websocket")
}

// Accept answers r, which IsUpgrade, with 101 Switching Protocols and returns the hijacked
// connection as the server's end of a WebSocket. A request that is not a version 13
// WebSocket upgrade is answered 426 or 400 here, and Accept returns an error.
func Accept(w http.ResponseWriter, r *http.Request) (net.Conn, error) {
	if !IsUpgrade(r) {
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "websocket")
		http.Error(w, "this path takes a WebSocket upgrade (HTTP/1.1 GET, Upgrade: websocket)", http.StatusUpgradeRequired)
		return nil, errors.New("wsconn: not a WebSocket upgrade")
	}
	if r.Header.Get("Sec-WebSocket-Version") != "13" {
		w.Header().Set("Sec-WebSocket-Version", "13")
		http.Error(w, "unsupported WebSocket version (13 only)", http.StatusBadRequest)
		return nil, errors.New("wsconn: unsupported WebSocket version")
	}
	key := r.Header.Get("Sec-WebSocket-Key")
	if k, err := base64.StdEncoding.DecodeString(key); err != nil || len(k) != 16 {
		http.Error(w, "bad Sec-WebSocket-Key", http.StatusBadRequest)
		return nil, errors.New("wsconn: bad Sec-WebSocket-Key")
	}
	rc := http.NewResponseController(w)
	c, brw, err := rc.Hijack()
	if err != nil {
		http.Error(w, "cannot upgrade this connection", http.StatusInternalServerError)
		return nil, fmt.Errorf("wsconn: hijacking the connection: %w", err)
	}
	_ = c.SetDeadline(time.Time{})
	if brw.Reader.Buffered() > 0 {
		// A client may not send frames before our 101; one that did is refused.
		_ = c.Close()
		return nil, fmt.Errorf("%w: data before the handshake's answer", ErrProtocol)
	}
	resp := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
		acceptKey(key) + "\r\n\r\n"
	if _, err := io.WriteString(c, resp); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("wsconn: answering the upgrade: %w", err)
	}
	return &Conn{Conn: c, br: bufio.NewReaderSize(c, 4096)}, nil
}

// Client asks for a WebSocket at path on c, an HTTP/1.1 connection (TLS or not) to host,
// and returns the client's end of it. header is added to the request. The exchange is
// bounded by c's deadlines, which the caller sets and clears.
func Client(c net.Conn, host, path string, header http.Header) (net.Conn, error) {
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	key := base64.StdEncoding.EncodeToString(nonce[:])
	var b strings.Builder
	fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\n", path, host, key)
	for k, vs := range header {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(c, b.String()); err != nil {
		return nil, fmt.Errorf("wsconn: sending the upgrade request: %w", err)
	}
	br := bufio.NewReaderSize(c, 4096)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodGet})
	if err != nil {
		return nil, fmt.Errorf("wsconn: reading the answer to the upgrade: %w", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		return nil, fmt.Errorf("wsconn: the upgrade was answered %q, not 101", resp.Status)
	}
	if !headerHas(resp.Header, "Upgrade", "websocket") || !headerHas(resp.Header, "Connection", "upgrade") ||
		resp.Header.Get("Sec-WebSocket-Accept") != acceptKey(key) {
		return nil, fmt.Errorf("%w: the 101 answer is not a WebSocket handshake's", ErrProtocol)
	}
	return &Conn{Conn: c, br: br, client: true}, nil
}

// Conn is one end of a WebSocket as a net.Conn: Write sends binary frames (masked from the
// client, as RFC 6455 requires), Read returns the payload of the data frames received. A
// ping is answered with a pong; a close frame is the end of the stream (io.EOF). Deadlines
// are the underlying connection's, but a read that fails while reading a frame's header
// (a deadline included) leaves the Conn failed. Close closes the underlying connection at once, with no closing handshake
// (the stream above says goodbye itself). One goroutine may read while others write.
type Conn struct {
	net.Conn
	br     *bufio.Reader
	client bool

	// read side: only the reading goroutine
	left   uint64 // payload bytes of the current data frame still to read
	mask   [4]byte
	masked bool
	pos    int // position in mask of the next payload byte
	rerr   error

	wmu sync.Mutex // one frame at a time
}

// Read implements net.Conn.
func (c *Conn) Read(p []byte) (int, error) {
	for c.left == 0 {
		if c.rerr != nil {
			return 0, c.rerr
		}
		if err := c.nextFrame(); err != nil {
			c.rerr = err // a header half read is lost for good, even after a timeout
			return 0, err
		}
	}
	if len(p) == 0 {
		return 0, nil
	}
	if uint64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.br.Read(p)
	c.unmask(p[:n])
	c.left -= uint64(n)
	if err == io.EOF && c.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (c *Conn) unmask(b []byte) {
	if c.masked {
		c.pos = maskBytes(c.mask, c.pos, b)
	}
}

// nextFrame reads frame headers until one of a data frame with payload, answering pings on
// the way. A close frame ends the stream with io.EOF.
func (c *Conn) nextFrame() error {
	var h [2]byte
	if _, err := io.ReadFull(c.br, h[:]); err != nil {
		return err
	}
	op, masked := h[0]&0x0f, h[1]&0x80 != 0
	if h[0]&0x70 != 0 {
		return fmt.Errorf("%w: reserved bits set (no extension was agreed)", ErrProtocol)
	}
	if masked == c.client { // a client masks what it sends; a server does not
		return fmt.Errorf("%w: frame masking", ErrProtocol)
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(c.br, b[:]); err != nil {
			return unexpected(err)
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(c.br, b[:]); err != nil {
			return unexpected(err)
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	c.masked, c.pos = masked, 0
	if masked {
		if _, err := io.ReadFull(c.br, c.mask[:]); err != nil {
			return unexpected(err)
		}
	}
	switch op {
	case opBinary, opText, opContinuation:
		c.left = n
		return nil
	case opClose, opPing, opPong:
		if n > 125 || h[0]&0x80 == 0 {
			return fmt.Errorf("%w: control frame too long or fragmented", ErrProtocol)
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(c.br, payload); err != nil {
			return unexpected(err)
		}
		c.unmask(payload)
		switch op {
		case opClose:
			return io.EOF
		case opPing:
			if err := c.writeFrame(opPong, payload); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("%w: unknown opcode %#x", ErrProtocol, op)
	}
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Write implements net.Conn: p goes out in binary frames of at most 32 KiB, each in one
// write to the underlying connection.
func (c *Conn) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), maxFrame)]
		if err := c.writeFrame(opBinary, chunk); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// framePool holds the buffers frames are put together in, shared by every Conn so that an
// idle one holds none.
var framePool = sync.Pool{New: func() any { b := make([]byte, 0, maxFrame+14); return &b }}

// writeFrame sends one final frame of opcode op with payload p (at most maxFrame bytes).
func (c *Conn) writeFrame(op byte, p []byte) error {
	bp := framePool.Get().(*[]byte)
	defer framePool.Put(bp)
	b := append((*bp)[:0], 0x80|op)
	var maskBit byte
	if c.client {
		maskBit = 0x80
	}
	switch n := len(p); {
	case n < 126:
		b = append(b, maskBit|byte(n))
	case n <= 0xffff:
		b = append(b, maskBit|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, maskBit|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	if c.client {
		var m [4]byte
		_, _ = rand.Read(m[:])
		b = append(b, m[:]...)
		start := len(b)
		b = append(b, p...)
		maskBytes(m, 0, b[start:])
	} else {
		b = append(b, p...)
	}
	*bp = b
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.Conn.Write(b)
	return err
}

// maskBytes XORs b with the mask m, starting at position pos of it, and returns the
// position after b.
func maskBytes(m [4]byte, pos int, b []byte) int {
	if len(b) >= 16 {
		var k [8]byte
		for i := range k {
			k[i] = m[(pos+i)&3]
		}
		k64 := binary.LittleEndian.Uint64(k[:])
		for len(b) >= 8 {
			binary.LittleEndian.PutUint64(b, binary.LittleEndian.Uint64(b)^k64)
			b = b[8:]
			pos += 8
		}
	}
	for i := range b {
		b[i] ^= m[pos&3]
		pos++
	}
	return pos
}
