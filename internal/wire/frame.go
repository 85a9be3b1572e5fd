package wire

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
)

// headerSize is the fixed frame header: one type byte and a big-endian uint32 payload length.
const headerSize = 5

// WriteFrame encodes m and writes it to w as one frame with a single Write call, so frames from
// one writer never interleave when the caller serialises calls.
func WriteFrame(w io.Writer, m Message) error {
	buf, err := AppendFrame(nil, m)
	if err != nil {
		return err
	}
	_, err = w.Write(buf)
	return err
}

// AppendFrame appends the encoding of m to dst.
func AppendFrame(dst []byte, m Message) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return dst, err
	}
	payload, err := json.Marshal(m)
	if err != nil {
		return dst, fmt.Errorf("wire: encode %s: %w", m.Type(), err)
	}
	if len(payload) > MaxFrameSize {
		return dst, fmt.Errorf("%w: %s payload is %d bytes", ErrFrameTooLarge, m.Type(), len(payload))
	}
	dst = append(dst, byte(m.Type()), 0, 0, 0, 0)
	binary.BigEndian.PutUint32(dst[len(dst)-4:], uint32(len(payload)))
	return append(dst, payload...), nil
}

// ReadFrame reads one frame from r and decodes it. A clean end of input before the first header
// byte returns io.EOF; a frame cut short returns io.ErrUnexpectedEOF. Errors from the decoder wrap
// ErrFrameTooLarge, ErrUnknownFrame or ErrMalformed. The payload is never read when its announced
// length is above MaxFrameSize, so a hostile peer cannot make the reader allocate.
func ReadFrame(r io.Reader) (Message, error) {
	var hdr [headerSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	t := Type(hdr[0])
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrameSize {
		return nil, fmt.Errorf("%w: %s announces %d bytes, the limit is %d", ErrFrameTooLarge, t, n, MaxFrameSize)
	}
	m := newMessage(t)
	if m == nil {
		return nil, fmt.Errorf("%w: %d", ErrUnknownFrame, hdr[0])
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if err := Decode(t, payload, m); err != nil {
		return nil, err
	}
	return m, nil
}

// Decode decodes a payload of type t into m, which must be the matching message type, and
// validates it.
func Decode(t Type, payload []byte, m Message) error {
	if m.Type() != t {
		return fmt.Errorf("%w: %s payload into %s", ErrMalformed, t, m.Type())
	}
	if err := json.Unmarshal(payload, m); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrMalformed, t, err)
	}
	if err := m.Validate(); err != nil {
		return fmt.Errorf("wire: %s: %w", t, err)
	}
	return nil
}

func newMessage(t Type) Message {
	switch t {
	case TypeHello:
		return new(Hello)
	case TypeWelcome:
		return new(Welcome)
	case TypeError:
		return new(Error)
	case TypeRegister:
		return new(Register)
	case TypeRegistered:
		return new(Registered)
	case TypeRejected:
		return new(Rejected)
	case TypeHealth:
		return new(Health)
	case TypeDrain:
		return new(Drain)
	case TypeDeregister:
		return new(Deregister)
	case TypeDeregistered:
		return new(Deregistered)
	case TypeReset:
		return new(Reset)
	}
	return nil
}
