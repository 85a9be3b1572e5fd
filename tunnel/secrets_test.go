package tunnel

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// logBuffer collects every log line, fully encoded, from any number of loggers.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *zap.Logger {
	enc := zapcore.NewJSONEncoder(zap.NewDevelopmentEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(b), zap.DebugLevel))
}

// TestSecretsNeverReachTheLogs runs a full scenario with every logger at debug level and
// scans the output for the raw group key, its full hash, and the tokens.
func TestSecretsNeverReachTheLogs(t *testing.T) {
	const (
		groupKey    = "correct-horse-battery-staple"
		token       = "connector-token-5f1e"
		tenantToken = "tenant-token-9a2b"
	)
	sum := sha256.Sum256([]byte(groupKey))
	fullHash := hex.EncodeToString(sum[:])

	var logs logBuffer
	op := newReceiver(t)
	e := startEdge(t, ServerConfig{
		LoadBalancing: LoadBalancing{
			Enabled: true,
		}, Logger: logs.logger(), Alerts: Alerts{
			WebhookURL: op.URL,
		},
		Auth: mustStaticTokens(t, []string{token}, map[string]string{"acme": tenantToken}),
	})
	b := backend(t, "b")
	spec := TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: groupKey}

	a := e.connect(WithToken(tenantToken), WithLogger(logs.logger())) // one pool, one tenant
	ta, err := a.Forward(ctxT(t), spec, hostPort(b.URL))
	require.NoError(t, err)
	c := e.connect(WithToken(tenantToken), WithLogger(logs.logger()))
	var h switchable
	specH := spec
	specH.Health = h.spec()
	_, err = c.Forward(ctxT(t), specH, hostPort(b.URL))
	require.NoError(t, err)

	// A wrong key, a wrong token, requests, a health flap, a drain and an alert.
	_, err = c.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: groupKey + "x"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrKeyMismatch)
	_, err = Dial(ctxT(t), e.controlAddr, WithToken(token+"x"), WithLogger(logs.logger()))
	require.ErrorIs(t, err, ErrUnauthorized)
	for range 10 {
		code, _ := e.get("pool", "/")
		require.Equal(t, http.StatusOK, code)
	}
	h.down.Store(true)
	require.NoError(t, ta.Close())
	require.Eventually(t, func() bool { return len(op.alerts()) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, a.Close())
	require.NoError(t, c.Close())

	out := logs.String()
	require.NotEmpty(t, out)
	require.Contains(t, out, sum2short(sum), "the short hash is what identifies a pool in logs")
	for name, secret := range map[string]string{
		"raw group key": groupKey, "full key hash": fullHash,
		"connector token": token, "tenant token": tenantToken,
	} {
		require.False(t, strings.Contains(out, secret), "the logs contain the %s", name)
	}
}

func sum2short(sum [32]byte) string { return hex.EncodeToString(sum[:4]) }
