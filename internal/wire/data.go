package wire

import (
	"crypto/sha256"
	"fmt"
	"io"
	"strings"
)

// Data connections
//
// Besides its control connection (one yamux session), a connector may open dedicated data
// connections to the edge's control listener: plain TCP connections, or TLS ones when its
// control connection is TLS. Each carries at most one public TCP connection, so the edge
// and the connector can copy bytes between two sockets with io.Copy and let Linux splice
// them, instead of paying yamux's framing, flow control and hand-offs for every byte.
//
// A data connection opens with a preamble:
//
//	magic(3) = 0xD7 'W' 'D'   version(1) = 1   len(1) session_id   data_token(32)
//
// The first byte cannot be mistaken for the start of a control connection: yamux's first
// byte is its version, 0. The edge peeks at that byte and hands the connection to its data
// code or to yamux. The session id names the connector's session; the data token proves the
// connection belongs to it (DataTokenOf). The edge compares tokens in constant time, answers
// a good preamble with the one byte DataAccepted and keeps the connection in the session's
// pool; anything else (an unknown session, a wrong token, a malformed preamble, a session
// with no TCP tunnel) is closed without an answer.
//
// From then on the connection is used exactly like a yamux data stream: the edge writes an
// envelope, the connector answers with one Ack. A refusal (any Ack but AckOK) leaves the
// connection idle: the edge may put it back in its pool and the connector waits for the next
// envelope. After AckOK both sides copy the public connection's bytes until it ends, and the
// connection is closed then: it is never reused. AckUseStream, which only data connections
// carry, asks the edge to reach that tunnel over yamux streams instead (an in-process Listen
// tunnel has no socket to splice to).
//
// A clean end is a TCP FIN (TLS: close_notify) in that direction. Because a connector (or
// edge) process that dies ends its sockets with a FIN too, a side that reads the end of a
// data connection confirms that its peer's session is alive (a yamux ping on the control
// connection) before it passes the end on as a clean one; a peer that fails the confirmation
// died, and the public connection is reset. Every other end (an error, a session or tunnel
// that ended) resets the data connection (RST), which the other side passes on as a reset.
//
// Capability: an edge that accepts data connections issues resume tokens that begin with
// DataResumePrefix (NewDataResumeToken); the data token is derived from the resume token,
// which only the edge and that connector know. Old connectors treat the resume token as
// opaque and never open data connections; a new connector opens them only to an edge whose
// resume token carries the prefix, so old edges never see one.

// DataMagic is the first byte of a data connection's preamble.
const DataMagic = 0xD7

// dataMagic is the preamble's whole magic.
var dataMagic = [3]byte{DataMagic, 'W', 'D'}

// dataVersion is the preamble version this build speaks.
const dataVersion = 1

// DataTokenLen is the length of a data token.
const DataTokenLen = 32

// MaxDataPreambleSize bounds an encoded preamble.
const MaxDataPreambleSize = len(dataMagic) + 1 + 1 + MaxTunnelIDLen + DataTokenLen

// DataAccepted is the edge's one-byte answer to a good preamble.
const DataAccepted = 0xA5

// AckUseStream is a connector's answer, on a data connection only, to an envelope for a
// tunnel it serves on yamux streams only (an in-process Listen tunnel): the edge should open
// a yamux stream to the same member instead. No byte reached an application; the data
// connection stays idle and may be used again.
const AckUseStream Ack = 4

// DataResumePrefix marks the resume token of an edge that accepts data connections.
const DataResumePrefix = "wd1."

// DataToken authenticates a data connection to its session.
type DataToken [DataTokenLen]byte

// DataPreamble is the first thing a connector writes on a data connection.
type DataPreamble struct {
	SessionID string
	Token     DataToken
}

// NewDataResumeToken returns the resume token an edge that accepts data connections issues:
// random (which the caller supplies, e.g. 32 hex characters) with DataResumePrefix.
func NewDataResumeToken(random string) string { return DataResumePrefix + random }

// DataTokenOf returns the data token of a session whose Welcome carried resumeToken, and
// whether that edge accepts data connections at all (the token has DataResumePrefix).
func DataTokenOf(resumeToken string) (DataToken, bool) {
	if !strings.HasPrefix(resumeToken, DataResumePrefix) || len(resumeToken) <= len(DataResumePrefix) {
		return DataToken{}, false
	}
	return sha256.Sum256([]byte("warren data connection\x00" + resumeToken)), true
}

// IsDataPreamble reports whether first, the first byte of a connection to the control
// listener, begins a data connection's preamble (and not a yamux session).
func IsDataPreamble(first byte) bool { return first == DataMagic }

// AppendDataPreamble appends the encoding of p to dst. It fails if the session id is empty
// or over its limit.
func AppendDataPreamble(dst []byte, p DataPreamble) ([]byte, error) {
	if p.SessionID == "" || len(p.SessionID) > MaxTunnelIDLen {
		return dst, fmt.Errorf("%w: data preamble session id length %d", ErrMalformed, len(p.SessionID))
	}
	dst = append(dst, dataMagic[:]...)
	dst = append(dst, dataVersion, byte(len(p.SessionID)))
	dst = append(dst, p.SessionID...)
	return append(dst, p.Token[:]...), nil
}

// ReadDataPreamble reads one preamble from r. It reads at most MaxDataPreambleSize bytes
// and allocates nothing before the session id's length is checked; the caller bounds the
// time with a deadline.
func ReadDataPreamble(r io.Reader) (DataPreamble, error) {
	var buf [MaxDataPreambleSize]byte
	head := len(dataMagic) + 2
	if _, err := io.ReadFull(r, buf[:head]); err != nil {
		return DataPreamble{}, unexpected(err)
	}
	if [3]byte(buf[:3]) != dataMagic {
		return DataPreamble{}, fmt.Errorf("%w: not a data connection preamble", ErrMalformed)
	}
	if buf[3] != dataVersion {
		return DataPreamble{}, fmt.Errorf("%w: data preamble version %d", ErrMalformed, buf[3])
	}
	n := int(buf[4])
	if n == 0 || n > MaxTunnelIDLen {
		return DataPreamble{}, fmt.Errorf("%w: data preamble session id length %d", ErrMalformed, n)
	}
	rest := buf[head : head+n+DataTokenLen]
	if _, err := io.ReadFull(r, rest); err != nil {
		return DataPreamble{}, unexpected(err)
	}
	p := DataPreamble{SessionID: string(rest[:n])}
	copy(p.Token[:], rest[n:])
	return p, nil
}
