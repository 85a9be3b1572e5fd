package tunnel

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/health"
)

// TestTunnelSpecValidate: Validate names each setting Forward refuses by its field (a
// missing one wrapping ErrRequired), and Forward refuses such a spec with ErrInvalid before
// anything reaches the edge.
func TestTunnelSpecValidate(t *testing.T) {
	require.NoError(t, TunnelSpec{Subdomain: "a"}.Validate())
	require.NoError(t, TunnelSpec{Proto: ProtoTCP, Group: "db", GroupKey: "k", Affinity: "client_ip"}.Validate())

	err := TunnelSpec{Proto: ProtoTCP, Group: "g", Weight: 101, Priority: -1, Affinity: "cookie",
		BackendProtocol: "h2c", PreviousGroupKeys: []string{""}, Health: &health.Spec{Type: "icmp"}}.Validate()
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *FieldError
		require.ErrorAs(t, e, &fe)
		fields = append(fields, fe.Field)
	}
	require.Equal(t, []string{"GroupKey", "Weight", "Priority", "PreviousGroupKeys", "Affinity", "BackendProtocol", "Health"}, fields, "%v", err)
	require.ErrorIs(t, err, ErrRequired)
	require.ErrorContains(t, err, "Weight: 101 is out of range 1-100")
	require.ErrorContains(t, err, `Affinity: "cookie" is for HTTP tunnels; a TCP pool takes client_ip`)

	err = TunnelSpec{Proto: ProtoTLS, Subdomain: "s", Health: &health.Spec{Type: health.TypeHTTP, Path: "/"}}.Validate()
	require.ErrorContains(t, err, "Health.Type:")

	e := startEdge(t, ServerConfig{})
	s := e.connect()
	_, err = s.Forward(ctxT(t), TunnelSpec{Subdomain: "a", Weight: -1}, "127.0.0.1:1")
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "Weight: -1 is out of range")
}
