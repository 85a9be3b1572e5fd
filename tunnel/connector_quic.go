package tunnel

import (
	"context"
	"crypto/tls"
	"fmt"

	"github.com/warren-tunnel/warren/internal/mux"
)

// WithQUIC makes the session reach the edge over QUIC, on the edge's UDP port
// (ServerConfig.QUICAddr): the address given to Dial or DialServers is that port's
// ("edge.example.com:4443"). The program must import package tunnel/quic, which links the
// transport in (without it Dial fails with an error naming the import, wrapping
// ErrInvalid). QUIC is always TLS 1.3: WithTLS sets how the edge is verified (its roots,
// its server name) as over TCP; without WithTLS the system's roots verify the edge's host
// name. Each request or connection the edge dispatches rides a QUIC stream of the session,
// which opens no data connections (WithDataReadBuffer has no effect).
//
// Proxies carry TCP, not UDP: WithProxy with a proxy is refused with WithQUIC (ErrInvalid),
// and HTTPS_PROXY, ALL_PROXY and NO_PROXY are not read. WithDialer (a TCP dialer) and
// WithWebSocket are refused with it too.
func WithQUIC() Option { return func(o *dialOptions) { o.quic = true } }

// checkQUIC refuses what cannot go with WithQUIC.
func (o *dialOptions) checkQUIC() error {
	if !o.quic {
		return nil
	}
	switch {
	case o.wsSet:
		return fmt.Errorf("tunnel: WithQUIC and WithWebSocket are two transports: choose one: %w", ErrInvalid)
	case o.proxySet && o.proxy != nil:
		return fmt.Errorf("tunnel: WithProxy does not apply to QUIC (a proxy carries TCP, QUIC is UDP): %w", ErrInvalid)
	case o.customDialer:
		return fmt.Errorf("tunnel: WithDialer does not apply to QUIC (it dials TCP connections): %w", ErrInvalid)
	}
	_, err := quicTransport()
	return err
}

// dialQUIC opens a connector's session over QUIC to cand, verified as WithTLS says (without
// it, against the system's roots), with cand's host as the server name.
func (s *Session) dialQUIC(ctx context.Context, cand candidate) (mux.Session, error) {
	q, err := quicTransport()
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{}
	if s.opts.tlsConfig != nil {
		cfg = s.opts.tlsConfig.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName = cand.host
	}
	m, err := q.Dial(ctx, cand.addr, cfg)
	if err != nil {
		return nil, fmt.Errorf("tunnel: QUIC to %s: %w", cand, err)
	}
	return m, nil
}
