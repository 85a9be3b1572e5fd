package wire

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
)

// TestRegisterTLSPassthrough: proto tls is accepted on the wire (its label is the
// subdomain), it takes no backend_protocol h2c (the edge never speaks HTTP to it), and its
// data streams travel with proto tcp in the envelope: raw bytes, which is how the connector
// carries them.
func TestRegisterTLSPassthrough(t *testing.T) {
	ok := &Register{Req: 9, Proto: group.ProtoTLS, Label: "pool", Group: "web", KeyHash: hash,
		Health: &HealthInfo{Kind: "tcp"}, LB: &LBInfo{Affinity: group.AffinityClientIP}}
	var buf bytes.Buffer
	require.NoError(t, WriteFrame(&buf, ok))
	got, err := ReadFrame(&buf)
	require.NoError(t, err)
	require.Equal(t, ok, got)

	_, err = ReadFrame(bytes.NewReader(frame(TypeRegister, `{"proto":"tls","label":"pool","backend_protocol":"h2c"}`)))
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "backend_protocol \"h2c\" is for http and https tunnels")
	_, err = ReadFrame(bytes.NewReader(frame(TypeRegister, `{"proto":"tls","label":"pool","backend_protocol":"http1"}`)))
	require.NoError(t, err, "http1 is the default and means nothing more")
	_, err = ReadFrame(bytes.NewReader(frame(TypeRegister, `{"proto":"TLS","label":"pool"}`)))
	require.ErrorIs(t, err, ErrMalformed, "protocol names are lower case")

	_, err = AppendEnvelope(nil, Envelope{TunnelID: "t", Proto: group.ProtoTLS})
	require.ErrorIs(t, err, ErrMalformed, "a tls stream's envelope says tcp: the connector carries raw bytes")
}
