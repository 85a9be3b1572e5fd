package wire

import (
	"fmt"
	"io"
)

// envelopeVersion is the first byte of every data-stream envelope.
const envelopeVersion = 1

// Proto codes used in the envelope.
const (
	protoCodeHTTP  = 1
	protoCodeHTTPS = 2
	protoCodeTCP   = 3
)

// MaxEnvelopeSize bounds an encoded envelope.
const MaxEnvelopeSize = 3 + MaxTunnelIDLen + 1 + MaxRemoteAddr

// Envelope is written by the edge at the start of every data stream it opens, before any payload:
// it tells the connector which tunnel the stream is for and who the public peer is.
//
// Layout: version(1) proto(1) len(1) tunnel_id len(1) remote_addr.
type Envelope struct {
	TunnelID   string
	RemoteAddr string
	Proto      string
}

// Ack is the connector's one-byte answer to an envelope. Only after AckOK does the edge send
// payload; any other answer, or none, means no byte of the request reached an application, so
// the edge may try another member.
type Ack byte

// Ack values.
const (
	AckOK            Ack = 0 // the local backend (or in-process listener) accepted the connection
	AckRefused       Ack = 1 // the local backend could not be reached
	AckUnknownTunnel Ack = 2 // the connector has no such tunnel (closed or never registered)
	AckMalformed     Ack = 3 // the envelope could not be decoded
)

// UnreadNotice is what a connector writes on an HTTP data stream, just before ending it, when
// its local backend reset the TCP connection (RST) while a request the edge sent was pending
// on it: no byte of a response had come back since the request began. The kernel sends RST
// on close only when the application left received bytes unread (or had already closed when
// they arrived), and an HTTP server cannot run a handler before it has read the blank line
// that ends a request head, so a bodyless request ended this way never reached a handler.
//
// The notice stands where a response head would begin; a response head never begins with a
// zero byte. Edges that do not know it read a malformed response, as they would have read
// the bare end of the stream.
var UnreadNotice = [2]byte{0x00, 0x01}

// String describes the acknowledgement.
func (a Ack) String() string {
	switch a {
	case AckOK:
		return "ok"
	case AckRefused:
		return "backend refused the connection"
	case AckUnknownTunnel:
		return "unknown tunnel"
	case AckMalformed:
		return "malformed envelope"
	}
	return fmt.Sprintf("ack(%d)", byte(a))
}

func protoCode(p string) (byte, bool) {
	switch p {
	case ProtoHTTP:
		return protoCodeHTTP, true
	case ProtoHTTPS:
		return protoCodeHTTPS, true
	case ProtoTCP:
		return protoCodeTCP, true
	}
	return 0, false
}

// AppendEnvelope appends the encoding of e to dst. It fails if a field is over its limit or the
// proto is unknown.
func AppendEnvelope(dst []byte, e Envelope) ([]byte, error) {
	code, ok := protoCode(e.Proto)
	if !ok {
		return dst, fmt.Errorf("%w: envelope proto %q", ErrMalformed, truncate(e.Proto, 16))
	}
	if e.TunnelID == "" || len(e.TunnelID) > MaxTunnelIDLen {
		return dst, fmt.Errorf("%w: envelope tunnel id length %d", ErrMalformed, len(e.TunnelID))
	}
	addr := e.RemoteAddr
	if len(addr) > MaxRemoteAddr {
		addr = addr[:MaxRemoteAddr]
	}
	dst = append(dst, envelopeVersion, code, byte(len(e.TunnelID)))
	dst = append(dst, e.TunnelID...)
	dst = append(dst, byte(len(addr)))
	return append(dst, addr...), nil
}

// ReadEnvelope reads one envelope from r.
func ReadEnvelope(r io.Reader) (Envelope, error) {
	var buf [MaxEnvelopeSize]byte
	if _, err := io.ReadFull(r, buf[:3]); err != nil {
		return Envelope{}, err
	}
	if buf[0] != envelopeVersion {
		return Envelope{}, fmt.Errorf("%w: envelope version %d", ErrMalformed, buf[0])
	}
	var e Envelope
	switch buf[1] {
	case protoCodeHTTP:
		e.Proto = ProtoHTTP
	case protoCodeHTTPS:
		e.Proto = ProtoHTTPS
	case protoCodeTCP:
		e.Proto = ProtoTCP
	default:
		return Envelope{}, fmt.Errorf("%w: envelope proto code %d", ErrMalformed, buf[1])
	}
	idLen := int(buf[2])
	if idLen == 0 || idLen > MaxTunnelIDLen {
		return Envelope{}, fmt.Errorf("%w: envelope tunnel id length %d", ErrMalformed, idLen)
	}
	// Read the id and the address length byte together.
	if _, err := io.ReadFull(r, buf[:idLen+1]); err != nil {
		return Envelope{}, unexpected(err)
	}
	e.TunnelID = string(buf[:idLen])
	addrLen := int(buf[idLen])
	if addrLen > 0 {
		if _, err := io.ReadFull(r, buf[:addrLen]); err != nil {
			return Envelope{}, unexpected(err)
		}
		e.RemoteAddr = string(buf[:addrLen])
	}
	return e, nil
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
