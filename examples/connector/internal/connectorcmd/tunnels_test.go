package connectorcmd

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel"
)

func TestTunnelError(t *testing.T) {
	rej := &tunnel.RejectedError{Code: "group_key_mismatch", Message: "group key does not match for subdomain 'pool'"}
	require.Equal(t, "tunnel b rejected: group key does not match for subdomain 'pool'", TunnelError("b", rej))
	require.Equal(t, "tunnel b: tunnel: session closed", TunnelError("b", tunnel.ErrSessionClosed))
}
