package tunnel

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"time"
)

// The edge's HTTP/2 servers are net/http's own (h2 by ALPN on the HTTPS listener, h2c with
// Public.H2C). The edge changes two things of them, on every connection:
//
//   - It never advertises extended CONNECT (RFC 8441, SETTINGS_ENABLE_CONNECT_PROTOCOL).
//     net/http's server advertises it when the process's GODEBUG holds http2xconnect=1,
//     read from the environment once, as net/http initialises (no HTTP2Config field sets
//     it, and //go:debug does not know the setting). Browsers then send their WebSockets as
//     extended CONNECT streams, which the edge does not carry to a member (a CONNECT gets
//     405); without the setting they upgrade over HTTP/1.1, which works end to end. So the
//     setting is taken out of the server's first frame, its SETTINGS (h2Conn).
//   - A public server decodes an HTTP/2 header block up to h2HeaderBlockBytes, more than
//     MaxHeaderBytes, and the proxy answers a request over MaxHeaderBytes 431 itself.
//     net/http's server bounds HPACK strings by its header list limit: one header field
//     past it fails HPACK decoding, which ends the whole connection (GOAWAY
//     COMPRESSION_ERROR) and every stream on it, where HTTP/1.1 answers the one request
//     431. Past h2HeaderBlockBytes the connection still ends: staying in step with the
//     client's HPACK state means holding the field, and that is the edge's bound.
//
// net/http hands an HTTP/2 connection to the functions of Server.TLSNextProto, one for TLS
// ("h2", the *tls.Conn) and one for h2c ("unencrypted_http2": the net.Conn in a *tls.Conn
// that was never a TLS connection, after the client preface was read). Only the second
// serves any net.Conn it is given, so both kinds go through it, wrapped: an h2 connection
// once the edge read its client preface itself (the TLS state stays available to the
// server through ConnectionState). The http.Server handed to those functions is their base
// configuration: a second one, with the header limit of HTTP/2 (setupHTTP2). Should net/http
// stop handing connections over this way, the functions are left as they are: HTTP/2 still
// works, without these two changes (TestPublicH2NeverAdvertisesExtendedConnect and
// TestH2OversizedHeaderGets431 say so).

// h2NextProtoTLS and h2NextProtoUnencrypted are net/http's Server.TLSNextProto keys of its
// HTTP/2 server.
const (
	h2NextProtoTLS         = "h2"
	h2NextProtoUnencrypted = "unencrypted_http2"
)

// h2ClientPreface starts every HTTP/2 connection a client opens.
const h2ClientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// h2PrefaceTimeout bounds the wait for the client preface on an h2 connection, as net/http's
// HTTP/2 server bounds it.
const h2PrefaceTimeout = 10 * time.Second

// h2HeaderBlockBytes is the header limit the public HTTP/2 servers decode up to, for a
// listener whose limit is maxHeaderBytes: twice that, and at least 64 KiB (nghttp2's bound
// on one header field). Within it, a request over maxHeaderBytes gets its 431 from the proxy
// and the connection goes on.
func h2HeaderBlockBytes(maxHeaderBytes int) int { return max(2*maxHeaderBytes, 64<<10) }

// setupHTTP2 makes hs's HTTP/2 connections go through h2Conn, with a base configuration
// whose header limit is h2MaxHeaderBytes (hs's own when 0). It does nothing when hs serves
// no HTTP/2. Call it before hs serves.
func setupHTTP2(hs *http.Server, h2MaxHeaderBytes int) {
	// Serve sets up net/http's HTTP/2 server (its TLSNextProto functions) before it
	// accepts: a listener that has nothing to accept stops it there.
	if err := hs.Serve(noAccept{}); !errors.Is(err, errNoAccept) {
		return
	}
	serveTLS, serve := hs.TLSNextProto[h2NextProtoTLS], hs.TLSNextProto[h2NextProtoUnencrypted]
	if serveTLS == nil || serve == nil {
		return
	}
	if h2MaxHeaderBytes <= 0 {
		h2MaxHeaderBytes = hs.MaxHeaderBytes
	}
	base := &http.Server{
		MaxHeaderBytes: h2MaxHeaderBytes,
		ReadTimeout:    hs.ReadTimeout,
		WriteTimeout:   hs.WriteTimeout,
		IdleTimeout:    hs.IdleTimeout,
		ErrorLog:       hs.ErrorLog,
		ConnState:      hs.ConnState,
		HTTP2:          hs.HTTP2,
	}
	hs.TLSNextProto[h2NextProtoTLS] = func(_ *http.Server, c *tls.Conn, h http.Handler) {
		_ = c.SetReadDeadline(time.Now().Add(h2PrefaceTimeout))
		var preface [len(h2ClientPreface)]byte
		if _, err := io.ReadFull(c, preface[:]); err != nil || string(preface[:]) != h2ClientPreface {
			return // net/http closes c
		}
		_ = c.SetReadDeadline(time.Time{})
		serve(base, handOver(&h2TLSConn{h2Conn: h2Conn{Conn: c}, tls: c}), h)
	}
	hs.TLSNextProto[h2NextProtoUnencrypted] = func(_ *http.Server, c *tls.Conn, h http.Handler) {
		nc, ok := c.NetConn().(interface{ UnencryptedNetConn() net.Conn })
		if !ok {
			serve(base, c, h)
			return
		}
		serve(base, handOver(&h2Conn{Conn: nc.UnencryptedNetConn()}), h)
	}
}

// errNoAccept is noAccept's Accept error.
var errNoAccept = errors.New("tunnel: nothing to accept")

// noAccept is a listener with nothing to accept: Serve on it returns at once, once it set
// up the server.
type noAccept struct{}

func (noAccept) Accept() (net.Conn, error) { return nil, errNoAccept }
func (noAccept) Close() error              { return nil }
func (noAccept) Addr() net.Addr            { return &net.TCPAddr{} }

// handOver wraps c as net/http wraps an h2c connection for its HTTP/2 server.
func handOver(c net.Conn) *tls.Conn { return tls.Client(unencrypted{Conn: c}, nil) }

// unencrypted carries a connection to net/http's HTTP/2 server, which takes it out with
// UnencryptedNetConn; the *tls.Conn around it is never used as one.
type unencrypted struct{ net.Conn }

func (u unencrypted) UnencryptedNetConn() net.Conn { return u.Conn }

// h2Conn is an HTTP/2 connection as the edge's server writes to it: its first frame, the
// server's SETTINGS, goes out without SETTINGS_ENABLE_CONNECT_PROTOCOL; everything else as
// written.
type h2Conn struct {
	net.Conn
	head []byte // what the server wrote before its first frame was whole
	done bool   // the first frame went out
}

// h2TLSConn is an h2Conn over TLS: the server reads its TLS state (ConnectionState), as it
// would of the *tls.Conn.
type h2TLSConn struct {
	h2Conn
	tls *tls.Conn
}

func (c *h2TLSConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }

// h2MaxFirstFrame bounds what h2Conn holds back before the server's first frame is whole:
// its SETTINGS take 9 bytes and 6 a setting, of which it sends six.
const h2MaxFirstFrame = 1 << 10

func (c *h2Conn) Write(p []byte) (int, error) {
	if c.done {
		return c.Conn.Write(p)
	}
	c.head = append(c.head, p...)
	if len(c.head) < 9 {
		return len(p), nil
	}
	n := 9 + (int(c.head[0])<<16 | int(c.head[1])<<8 | int(c.head[2]))
	if len(c.head) < n && len(c.head) < h2MaxFirstFrame {
		return len(p), nil
	}
	out := c.head
	if len(out) >= n {
		first := withoutExtendedConnect(out[:n])
		out = append(first[:len(first):len(first)], out[n:]...)
	}
	c.done, c.head = true, nil
	if _, err := c.Conn.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// h2SettingEnableConnectProtocol is SETTINGS_ENABLE_CONNECT_PROTOCOL (RFC 8441).
const h2SettingEnableConnectProtocol = 0x8

// withoutExtendedConnect returns frame, a whole HTTP/2 frame, without the
// SETTINGS_ENABLE_CONNECT_PROTOCOL parameters it holds if it is a SETTINGS frame.
func withoutExtendedConnect(frame []byte) []byte {
	const settings, ack = 0x4, 0x1
	if frame[3] != settings || frame[4]&ack != 0 || (len(frame)-9)%6 != 0 {
		return frame
	}
	out := bytes.Clone(frame[:9])
	for p := frame[9:]; len(p) >= 6; p = p[6:] {
		if int(p[0])<<8|int(p[1]) != h2SettingEnableConnectProtocol {
			out = append(out, p[:6]...)
		}
	}
	n := len(out) - 9
	out[0], out[1], out[2] = byte(n>>16), byte(n>>8), byte(n)
	return out
}
