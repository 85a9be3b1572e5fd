package wire

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/warren-tunnel/warren/group"
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
	Proto      group.Proto
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

// The unread notice is what a connector writes on an HTTP data stream, just before ending it,
// when its local backend reset the TCP connection (RST) while a bodyless request the edge sent
// was pending on it: no byte of a response had come back since the request began. The kernel
// sends RST on close only when the application left received bytes unread (or had already
// closed when they arrived), and an HTTP server cannot run a handler before it has read the
// blank line that ends a request head, so such a request never reached a handler.
//
// Layout: 0x00 0x01 and an 8-byte tag, the first bytes of HMAC-SHA256(key, stream id), where
// the key comes from the session's resume token (NoticeKey). The notice stands where a
// response head would begin; the backend, which never sees the key, cannot forge it with
// bytes of its own. Edges that do not know it read a malformed response, as they would have
// read the bare end of the stream.
const UnreadNoticeLen = 2 + unreadTagLen

const unreadTagLen = 8

var unreadNoticeHead = [2]byte{0x00, 0x01}

// NoticeKey derives the key that tags a session's unread notices from the resume token the
// edge issued in its Welcome: only the edge and that connector know it.
func NoticeKey(resumeToken string) [32]byte {
	return sha256.Sum256([]byte("warren unread notice\x00" + resumeToken))
}

func unreadTag(key *[32]byte, streamID uint32) [unreadTagLen]byte {
	m := hmac.New(sha256.New, key[:])
	var id [4]byte
	binary.BigEndian.PutUint32(id[:], streamID)
	m.Write(id[:])
	var tag [unreadTagLen]byte
	copy(tag[:], m.Sum(nil))
	return tag
}

// AppendUnreadNotice appends the unread notice for data stream streamID, tagged with key.
func AppendUnreadNotice(dst []byte, key *[32]byte, streamID uint32) []byte {
	tag := unreadTag(key, streamID)
	return append(append(dst, unreadNoticeHead[:]...), tag[:]...)
}

// MaybeUnreadNotice reports whether b, the first bytes where a response head would begin,
// may be an unread notice: it begins with the notice's zero byte, which no response does.
func MaybeUnreadNotice(b []byte) bool { return len(b) > 0 && b[0] == unreadNoticeHead[0] }

// IsUnreadNotice reports whether b is exactly the unread notice for stream streamID under key.
func IsUnreadNotice(b []byte, key *[32]byte, streamID uint32) bool {
	if len(b) != UnreadNoticeLen || [2]byte(b[:2]) != unreadNoticeHead {
		return false
	}
	tag := unreadTag(key, streamID)
	return hmac.Equal(b[2:], tag[:])
}

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

func protoCode(p group.Proto) (byte, bool) {
	switch p {
	case group.ProtoHTTP:
		return protoCodeHTTP, true
	case group.ProtoHTTPS:
		return protoCodeHTTPS, true
	case group.ProtoTCP:
		return protoCodeTCP, true
	}
	return 0, false
}

// AppendEnvelope appends the encoding of e to dst. It fails if a field is over its limit or the
// proto is unknown.
func AppendEnvelope(dst []byte, e Envelope) ([]byte, error) {
	code, ok := protoCode(e.Proto)
	if !ok {
		return dst, fmt.Errorf("%w: envelope proto %q", ErrMalformed, truncate(string(e.Proto), 16))
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

// ResetChannel is what begins, in place of an envelope, the stream an edge opens first on an
// edge-to-edge link to carry Reset frames for the link's other streams (the link has no
// control stream otherwise). Its first byte is no envelope version: an edge that does not
// know it answers AckMalformed, and the other edge then sends no resets on that link.
var ResetChannel = [3]byte{0xf0, 'R', 'S'}

// ErrResetChannel is what ReadEnvelope returns for a stream that begins with ResetChannel.
var ErrResetChannel = errors.New("wire: the stream is a reset channel")

// ReadEnvelope reads one envelope from r; a stream that begins with ResetChannel instead
// returns ErrResetChannel.
func ReadEnvelope(r io.Reader) (Envelope, error) {
	var buf [MaxEnvelopeSize]byte
	if _, err := io.ReadFull(r, buf[:3]); err != nil {
		return Envelope{}, err
	}
	if [3]byte(buf[:3]) == ResetChannel {
		return Envelope{}, ErrResetChannel
	}
	if buf[0] != envelopeVersion {
		return Envelope{}, fmt.Errorf("%w: envelope version %d", ErrMalformed, buf[0])
	}
	var e Envelope
	switch buf[1] {
	case protoCodeHTTP:
		e.Proto = group.ProtoHTTP
	case protoCodeHTTPS:
		e.Proto = group.ProtoHTTPS
	case protoCodeTCP:
		e.Proto = group.ProtoTCP
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
