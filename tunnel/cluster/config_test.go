package cluster

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel"
)

// fieldsOf returns the fields the FieldErrors in err name, in order.
func fieldsOf(t *testing.T, err error) []string {
	t.Helper()
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *tunnel.FieldError
		require.ErrorAs(t, e, &fe)
		fields = append(fields, fe.Field)
	}
	return fields
}

// TestConfigValidate: Validate names every setting New refuses by its field, without
// connecting; zero settings take their defaults.
func TestConfigValidate(t *testing.T) {
	ok := Config{NATSURLs: []string{"nats://127.0.0.1:4222"}, Advertise: "127.0.0.1:7443", Token: "edges-secret"}
	require.NoError(t, ok.Validate())

	err := Config{EdgeID: "edge a", Advertise: "10.0.0.5", LeaseTTL: 100 * time.Millisecond, Bucket: "a.b",
		Replicas: MaxReplicas + 2}.Validate()
	require.Equal(t, []string{"NATSURLs", "EdgeID", "Advertise", "Token", "LeaseTTL", "Bucket", "Replicas"}, fieldsOf(t, err), "%v", err)
	require.ErrorIs(t, err, tunnel.ErrRequired, "a missing setting is required")
	require.ErrorContains(t, err, `EdgeID: "edge a" may hold only letters, digits, "-" and "_"`)
	require.ErrorContains(t, err, "Replicas: must be at most 5 (JetStream's limit), got 7")
	require.NotContains(t, err.Error(), "nats_urls", "the library's errors name its fields, not a file's keys")

	_, err = New(Config{Advertise: "127.0.0.1:7443", Token: "edges-secret"})
	var fe *tunnel.FieldError
	require.True(t, errors.As(err, &fe))
	require.Equal(t, "cluster: tunnel: NATSURLs: required: the NATS servers the edges share", err.Error())
}
