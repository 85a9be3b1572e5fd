// Command edge runs a Warren edge configured by a server.toml file:
//
//	go run ./examples/edge -config examples/edge/server.example.toml
//
// It is a thin wrapper: the file is parsed by examples/internal/config, turned into a
// tunnel.ServerConfig, and served with tunnel.Server.ListenAndServe. SIGINT or SIGTERM
// shuts the edge down gracefully (bounded by limits.drain_timeout_secs; the log counts the
// streams left) and exits 0; a second signal during that drain ends the process at once.
//
// SIGHUP reads the file again without dropping a connector: connector tokens and tenants,
// the TLS certificate and key files, the tenant quotas (the [limits] defaults and each
// tenant's own) and limits.max_tunnels_per_session, and the [[endpoints]] with their
// policies apply at once (tunnel.Server.Reload), each logged as "applied: …". A lowered
// quota applies to the next session, registration or event stream: nothing already held is
// taken back. Every other changed setting (ports, bind, domain, region, state_dir, TLS on or
// off, require_auth, admin_token, the other [limits], [load_balancing], [cluster]) is logged as
// "not applied: key (old -> new): reason" and keeps its running value until a restart. A
// file that does not load, or that the edge refuses, changes nothing. "edge -check -config FILE" validates a file: "ok" and exit
// 0, or its line-numbered errors and exit 1.
//
// With a [cluster] table the edge joins a cluster: it connects to NATS before it listens
// (when it cannot reach NATS it does not start, and exits 2), listens for the other edges on
// cluster.peer_addr (or peer_port) as well, and leaves the cluster gracefully when it shuts down. -check
// does not connect to NATS.
//
// Exit codes: 0 after a signal, 1 when a listener fails, 2 for bad flags or a bad
// configuration file (the message names the file, the line and the key).
//
// Logs go to stderr as JSON at info level; -v switches to a human-readable debug log.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/admin"
	"github.com/warren-tunnel/warren/tunnel/cluster"
	"github.com/warren-tunnel/warren/tunnel/config"
	"github.com/warren-tunnel/warren/tunnel/store"
	"github.com/warren-tunnel/warren/tunnel/store/boltstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, stop, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command. ctx ends on the first signal; stop restores the default
// signal behaviour so that a second signal kills the process during the drain.
func run(ctx context.Context, stop func(), args []string, stderr io.Writer) int {
	return runWith(ctx, stop, args, os.Stdout, stderr)
}

// runWith is run with stdout (where -check says "ok") given.
func runWith(ctx context.Context, stop func(), args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "server.toml", "the edge's configuration `file`")
	verbose := fs.Bool("v", false, "human-readable debug logging instead of JSON at info level")
	check := fs.Bool("check", false, "validate the configuration file, print \"ok\" or its errors, and exit (0 or 1)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: edge [-v] [-config server.toml]\n       edge -check [-config server.toml]\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 0 {
		fs.Usage()
		return 2
	}

	if *check {
		return runCheck(*path, stdout, stderr)
	}
	cfg, err := config.LoadServer(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	log := newLogger(stderr, *verbose)
	defer func() { _ = log.Sync() }()

	sc, live, err := buildServerConfig(cfg, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if sc.Store, err = openStore(cfg); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cfg.File, err)
		return 2
	}
	srv, err := tunnel.NewServer(sc)
	if err != nil {
		if sc.Store != nil {
			_ = sc.Store.Close()
		}
		fmt.Fprintf(stderr, "%s: %v\n", cfg.File, err)
		return 2
	}
	adminAddr := cfg.Server.Addr(cfg.Server.AdminPort)
	log.Info("edge starting",
		zap.String("control", sc.ControlAddr), zap.String("http", orOff(sc.Public.HTTPAddr)),
		zap.String("https", orOff(sc.Public.HTTPSAddr)), zap.String("admin", orOff(adminAddr)),
		zap.String("tcp_ports", fmt.Sprintf("%d-%d", sc.TCP.Ports.Lo, sc.TCP.Ports.Hi)),
		zap.Bool("tls", sc.TLSConfig != nil), zap.Bool("load_balancing", sc.LoadBalancing.Enabled),
		zap.String("domain", sc.Domain), zap.String("region", sc.RegionID))
	if cl := cfg.Cluster; cl != nil {
		id := cl.EdgeID
		if id == "" {
			id = "(the host name)"
		}
		log.Info("edge joined the cluster", zap.String("edge_id", id), zap.String("advertise", cl.Advertise),
			zap.String("peer_addr", cl.PeerAddr), zap.Int("nats_urls", len(cl.NATSURLs)), zap.String("bucket", cl.Bucket),
			zap.Duration("lease", cl.LeaseTTL), zap.Bool("peer_tls", cl.TLS.Enabled()))
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	rl := &reloader{path: cfg.File, log: log, srv: srv, start: cfg, sc: sc, live: live, last: cfg}

	served, serving := make(chan error, 2), 1
	if adminAddr != "" {
		plane, err := serveAdmin(srv, adminAddr, cfg.Auth.AdminToken, log, served)
		if err != nil {
			_ = srv.Close()
			log.Error("edge stopped", zap.Error(err))
			return 1
		}
		defer plane.Close()
		serving++
	}
	go func() { served <- srv.ListenAndServe() }()

wait:
	for {
		select {
		case err := <-served: // a listener failed before any signal
			_ = srv.Close()
			log.Error("edge stopped", zap.Error(err))
			return 1
		case <-hup:
			rl.logReload()
		case <-ctx.Done():
			break wait
		}
	}
	stop()
	log.Info("shutting down", zap.Duration("drain_timeout", sc.Timeouts.Drain))
	sctx, cancel := context.WithTimeout(context.Background(), sc.Timeouts.Drain)
	defer cancel()
	if err := shutdownCounting(sctx, srv, log); err != nil {
		log.Warn("drain did not finish in time; connections were closed", zap.Error(err))
	}
	for range serving {
		if err := <-served; !errors.Is(err, tunnel.ErrServerClosed) {
			log.Warn("listener error during shutdown", zap.Error(err))
		}
	}
	log.Info("edge stopped")
	return 0
}

// serveAdmin serves the edge's operator plane (package tunnel/admin: /healthz, /metrics,
// /api, the status page) on addr with token, sending the end of its serving to served.
func serveAdmin(srv *tunnel.Server, addr, token string, log *zap.Logger, served chan<- error) (*admin.Plane, error) {
	plane, err := admin.New(srv, admin.Options{Token: token, Logger: log.Named("admin")})
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		plane.Close()
		return nil, fmt.Errorf("listen %s (admin): %w", addr, err)
	}
	log.Info("listening", zap.String("listener", "admin"), zap.Stringer("addr", l.Addr()), zap.Bool("tls", false))
	go func() { served <- srv.ServeAdmin(l, plane.Handler()) }()
	return plane, nil
}

// serverConfig turns the parsed file into the edge's configuration. Its error names the
// file (a TLS key pair that does not load).
func serverConfig(c *config.Server, log *zap.Logger) (tunnel.ServerConfig, error) {
	sc, _, err := buildServerConfig(c, log)
	return sc, err
}

// buildServerConfig is serverConfig, and also returns the parts SIGHUP can replace: the
// edge's Authenticator and TLS certificate are read through them.
func buildServerConfig(c *config.Server, log *zap.Logger) (tunnel.ServerConfig, *liveParts, error) {
	live := &liveParts{}
	s := c.Server
	sc := tunnel.ServerConfig{
		Domain:   s.Domain,
		RegionID: s.RegionID,
		Logger:   log,
		LoadBalancing: tunnel.LoadBalancing{
			Enabled:                c.LoadBalancing.Enabled,
			Strategy:               c.LoadBalancing.Strategy,
			MaxConcurrentPerMember: c.Limits.MaxConcurrentPerMember,
			RetryUnreadRequests:    c.LoadBalancing.RetryUnreadRequests,
			RetryIdempotent:        c.LoadBalancing.RetryIdempotent,
		},

		TCP: tunnel.TCPTunnels{
			Ports:          group.PortRange{Lo: c.Limits.TCPPortRange.Low, Hi: c.Limits.TCPPortRange.High},
			BindHost:       s.Bind.String(),
			DataReadBuffer: s.DataReadBuffer,
		},

		ControlAddr: s.Addr(s.ControlPort),
		Public: tunnel.PublicHTTP{
			HTTPAddr:       s.Addr(s.HTTPPort),
			HTTPSAddr:      s.Addr(s.HTTPSPort),
			URLHTTPPort:    s.HTTPPort,
			URLHTTPSPort:   s.HTTPSPort,
			H2C:            s.H2C,
			TrustedProxies: config.Prefixes(s.TrustedProxies),
		},

		Limits: tunnel.Limits{
			MaxTunnelsPerSession: c.Limits.MaxTunnelsPerSession,
			Tenant:               tenantLimits(c.Limits.Quotas),
		},
		RequestBody: tunnel.RequestBodyLimits{
			MaxBytes:     c.Limits.RequestBodyMaxBytes,
			Timeout:      orNoLimit(c.Limits.RequestBodyTimeout),
			MinRate:      orNoLimit(c.Limits.RequestBodyMinRate),
			MinRateGrace: c.Limits.RequestBodyMinRateGrace,
		},
		Timeouts: tunnel.Timeouts{
			Drain: c.Limits.DrainTimeout,
		},

		StalledResponses: tunnel.StalledResponseLimits{
			Timeout:         orNoLimit(c.Limits.ResponseStallTimeout),
			MaxBytes:        orNoLimit(c.Limits.MaxStalledResponseBytes),
			MaxBytesPerConn: orNoLimit(c.Limits.MaxStalledResponseBytesPerConn),
			MaxBytesPerIP:   orNoLimit(c.Limits.MaxStalledResponseBytesPerIP),
		},

		PreAuth: tunnel.PreAuthLimits{
			HelloTimeout:         c.Limits.HelloTimeout,
			MaxConns:             c.Limits.MaxPreAuthConns,
			MaxConnsPerIP:        c.Limits.MaxPreAuthConnsPerIP,
			MaxAuthFailuresPerIP: c.Limits.MaxAuthFailuresPerIP,
			AuthFailureWindow:    c.Limits.AuthFailureWindow,
			AuthBlockDuration:    c.Limits.AuthBlock,
		},

		Alerts: tunnel.Alerts{
			WebhookURL:           c.LoadBalancing.AlertWebhookURL,
			AllowPrivateWebhooks: c.LoadBalancing.AllowPrivateAlertWebhooks,
			MinInterval:          c.LoadBalancing.AlertMinInterval,
		},

		RouteTTL: c.Limits.RouteTTL,
	}
	if c.LoadBalancing.OutlierEjection {
		sc.LoadBalancing.OutlierEjection = &group.DefaultEjection
	}
	for _, t := range c.Auth.Tenants {
		if t.Quotas != (config.Quotas{}) {
			if sc.Limits.PerTenant == nil {
				sc.Limits.PerTenant = map[string]tunnel.TenantLimits{}
			}
			sc.Limits.PerTenant[t.Name] = tenantLimits(t.Quotas)
		}
	}
	for _, ep := range c.Endpoints {
		sc.Endpoints = append(sc.Endpoints, tunnel.Endpoint{
			Subdomain: ep.Subdomain,
			Proto:     tunnel.Proto(ep.Proto),
			Port:      ep.Port,
			Tenant:    ep.Tenant,
			Group:     ep.Group,
			KeyHash:   config.KeyHash(ep.KeySHA256),
			Policy: tunnel.Policy{
				AllowCIDRs:    config.Prefixes(ep.AllowCIDRs),
				DenyCIDRs:     config.Prefixes(ep.DenyCIDRs),
				RateLimit:     ep.RateLimit,
				RateBurst:     ep.RateBurst,
				MaxConcurrent: ep.MaxConcurrent,
			},
		})
	}
	if c.Auth.RequireAuth {
		tenants := make(map[string]string, len(c.Auth.Tenants))
		for _, t := range c.Auth.Tenants {
			tenants[t.Name] = t.Token
		}
		auth, err := tunnel.NewStaticTokens(c.Auth.Tokens, tenants)
		if err != nil {
			return tunnel.ServerConfig{}, nil, fmt.Errorf("%s: auth: %w", c.File, err)
		}
		live.auth = newLiveAuth(auth)
		sc.Auth = live.auth
	}
	if c.Cluster != nil {
		cc, err := clusterConfig(c.Cluster)
		if err != nil {
			return tunnel.ServerConfig{}, nil, fmt.Errorf("%s: cluster: %w", c.File, err)
		}
		if sc.Cluster, err = cluster.New(cc); err != nil {
			return tunnel.ServerConfig{}, nil, fmt.Errorf("%s: %w", c.File, err)
		}
	}
	if c.TLS.Enabled() {
		cert, err := tls.LoadX509KeyPair(c.TLS.CertPath, c.TLS.KeyPath)
		if err != nil {
			return tunnel.ServerConfig{}, nil, fmt.Errorf("%s: tls: loading cert_path and key_path: %w", c.File, err)
		}
		live.cert = newLiveCert(cert)
		sc.TLSConfig = &tls.Config{GetCertificate: live.cert.get, MinVersion: tls.VersionTLS12}
	}
	return sc, live, nil
}

// openStore opens the route store that server.state_dir names, if it names one: the edge
// keeps route ownership in a bbolt file there, so that it survives restarts, and closes the
// store when it stops. Without state_dir the edge keeps ownership in memory (a nil Store).
// It is not part of buildServerConfig, which SIGHUP and -check run again: a second Open of
// the directory would find it locked by the first.
func openStore(c *config.Server) (store.Store, error) {
	if c.Server.StateDir == "" {
		return nil, nil
	}
	st, err := boltstore.Open(c.Server.StateDir)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// clusterConfig turns the [cluster] table into the edge's cluster configuration, loading
// the edge-to-edge TLS files.
func clusterConfig(c *config.Cluster) (cluster.Config, error) {
	cc := cluster.Config{
		NATSURLs:  c.NATSURLs,
		EdgeID:    c.EdgeID,
		Advertise: c.Advertise,
		PeerAddr:  c.PeerAddr,
		Token:     c.Token,
		LeaseTTL:  c.LeaseTTL,
		Bucket:    c.Bucket,
		Replicas:  c.Replicas,
		Timeout:   c.Timeout,
	}
	if !c.TLS.Enabled() {
		return cc, nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLS.CertPath, c.TLS.KeyPath)
	if err != nil {
		return cluster.Config{}, fmt.Errorf("tls: loading cert_path and key_path: %w", err)
	}
	cc.PeerTLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	// The client side presents no certificate: the token authenticates the edge.
	cc.PeerClientTLS = &tls.Config{MinVersion: tls.VersionTLS12}
	if c.TLS.CAPath != "" {
		pem, err := os.ReadFile(c.TLS.CAPath)
		if err != nil {
			return cluster.Config{}, fmt.Errorf("tls: reading ca_path: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return cluster.Config{}, fmt.Errorf("tls: ca_path %s holds no PEM certificate", c.TLS.CAPath)
		}
		cc.PeerClientTLS.RootCAs = pool
	}
	return cc, nil
}

// tenantLimits turns the file's quotas into the edge's.
func tenantLimits(q config.Quotas) tunnel.TenantLimits {
	return tunnel.TenantLimits{MaxSessions: q.MaxSessions, MaxTunnels: q.MaxTunnels,
		MaxTCPPorts: q.MaxTCPPorts, MaxEventStreams: q.MaxEventStreams}
}

// orNoLimit turns the file's 0 (no limit) into the edge's: a negative value (its 0 means
// the default).
func orNoLimit[T time.Duration | int64](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

func orOff(addr string) string {
	if addr == "" {
		return "off"
	}
	return addr
}

// newLogger returns a JSON logger at info level, or with verbose a human-readable one at
// debug level, writing to w.
func newLogger(w io.Writer, verbose bool) *zap.Logger {
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	enc, level := zapcore.NewJSONEncoder(ec), zapcore.InfoLevel
	if verbose {
		enc, level = zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.DebugLevel
	}
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), level))
}
