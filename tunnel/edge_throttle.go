package tunnel

import (
	"errors"
	"time"

	"github.com/warren-tunnel/warren/internal/throttle"
)

// errPreAuthFull is ServeConn's error for a connection over PreAuth.MaxConns or
// PreAuth.MaxConnsPerIP.
var errPreAuthFull = errors.New("tunnel: too many control connections waiting to authenticate")

// throttles returns the edge's limiter of failed authentications and its cap on the control
// connections not yet authenticated.
func (c *ServerConfig) throttles() (*throttle.Auth, *throttle.Conns) {
	log := c.Logger.Named("throttle")
	auth := throttle.NewAuth(throttle.AuthConfig{
		MaxFailures: c.PreAuth.MaxAuthFailuresPerIP,
		Window:      c.PreAuth.AuthFailureWindow,
		Block:       c.PreAuth.AuthBlockDuration,
		Delay:       c.PreAuth.AuthFailureDelay,
		Logger:      log,
	})
	conns := throttle.NewConns(throttle.ConnsConfig{
		Max:       c.PreAuth.MaxConns,
		MaxPerKey: c.PreAuth.MaxConnsPerIP,
		What:      "control connections waiting to authenticate",
		Logger:    log,
	})
	return auth, conns
}

// logThrottled writes the throttles' aggregate log lines every interval until done closes,
// then the counts still unlogged.
func logThrottled(authLimit *throttle.Auth, preAuth *throttle.Conns, done <-chan struct{}) {
	t := time.NewTicker(authLimit.LogInterval())
	defer t.Stop()
	for {
		select {
		case <-t.C:
			authLimit.Flush(false)
			preAuth.Flush(false)
		case <-done:
			authLimit.Flush(true)
			preAuth.Flush(true)
			return
		}
	}
}
