// Package wire defines Warren's connector ↔ edge protocol: the control-stream frames and the
// envelope written at the start of every data stream. It is the only place that knows the byte
// layout; spec.md beside this file writes the protocol down.
//
// Decoding is defensive: every length is checked against a hard limit before anything is
// allocated, and no input makes a decoder panic (see the fuzz targets).
package wire

import (
	"errors"
	"fmt"
)

// Version is the protocol version this build speaks. A connector sends it in Hello; an edge
// rejects a Hello with any other version.
const Version = 1

// MaxFrameSize is the largest control-frame payload accepted, in bytes. Control frames are small
// JSON documents; anything bigger is hostile or broken.
const MaxFrameSize = 64 << 10

// Limits on the fields carried on the wire. They bound memory per session and keep labels
// usable as DNS names.
const (
	MaxTokenLen     = 512
	MaxLabelLen     = 63
	MaxGroupLen     = 128
	MaxReasonLen    = 512
	MaxURLLen       = 2048
	MaxTunnelIDLen  = 64
	MaxRemoteAddr   = 255
	MaxErrorMessage = 1024
)

// Errors returned by the decoders. They are wrapped with details; test with errors.Is.
var (
	// ErrFrameTooLarge means a frame announced a payload above MaxFrameSize.
	ErrFrameTooLarge = errors.New("wire: frame too large")
	// ErrUnknownFrame means the frame type byte is not one this version defines.
	ErrUnknownFrame = errors.New("wire: unknown frame type")
	// ErrMalformed means a frame or envelope could not be decoded or failed validation.
	ErrMalformed = errors.New("wire: malformed message")
)

// Type identifies a control frame.
type Type uint8

// Control frame types. Direction: C = connector → edge, E = edge → connector.
const (
	TypeHello        Type = 1  // C: first frame: version and token
	TypeWelcome      Type = 2  // E: hello accepted
	TypeError        Type = 3  // E: fatal error; the edge closes the session after sending it
	TypeRegister     Type = 4  // C: register a tunnel
	TypeRegistered   Type = 5  // E: registration accepted
	TypeRejected     Type = 6  // E: registration refused
	TypeHealth       Type = 7  // C: a tunnel's health changed
	TypeDrain        Type = 8  // C: stop selecting a tunnel, let its streams finish, then remove it
	TypeDeregister   Type = 9  // C: remove a tunnel now
	TypeDeregistered Type = 10 // E: a tunnel is gone (after Drain or Deregister, or removed by the edge)
	TypeReset        Type = 11 // E: the edge abandoned these data streams: end them and their backend connections
)

// String names the frame type.
func (t Type) String() string {
	switch t {
	case TypeHello:
		return "hello"
	case TypeWelcome:
		return "welcome"
	case TypeError:
		return "error"
	case TypeRegister:
		return "register"
	case TypeRegistered:
		return "registered"
	case TypeRejected:
		return "rejected"
	case TypeHealth:
		return "health"
	case TypeDrain:
		return "drain"
	case TypeDeregister:
		return "deregister"
	case TypeDeregistered:
		return "deregistered"
	case TypeReset:
		return "reset"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}
