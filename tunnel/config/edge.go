package config

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/cluster"
)

// Edge is an edge as a server.toml describes it: the tunnel.ServerConfig to create it with,
// and what the program around it wires: the admin plane (package tunnel/admin, which this
// package does not link), the route store and the cluster. (*Server).Edge makes one; Reload
// applies the file again to the running edge made from it.
type Edge struct {
	// File is the name of the file it was read from.
	File string
	// Config is the edge's configuration, every default the library's own
	// (tunnel.ServerConfig.WithDefaults). Its Auth checks the file's tokens and its
	// TLSConfig serves the file's certificate, both read through values that Reload
	// replaces; Cluster is set with a [cluster] table (cluster.New of ClusterConfig). Store
	// is nil: the program opens the one StateDir names (tunnel/store/boltstore.Open), once,
	// for the edge it runs.
	Config tunnel.ServerConfig
	// AdminAddr is where the admin plane listens (server.admin_bind, by default loopback, and server.admin_port), "" when
	// it is off; AdminToken is its bearer token (auth.admin_token), for admin.Options.Token.
	AdminAddr, AdminToken string
	// AdminHosts are the names the admin port is reached by (server.admin_hosts), for
	// admin.Options.Hosts.
	AdminHosts []string
	// StateDir is the directory route ownership is kept in (server.state_dir), "" to keep it
	// in memory.
	StateDir string
	// ClusterConfig is the [cluster] table as the library's cluster configuration, its TLS
	// files loaded; nil without the table.
	ClusterConfig *cluster.Config

	start *Server // the file the edge was made from: what it runs, but for the live parts
	last  *Server // the file last applied, for the live parts
	auth  *liveAuth
	cert  *liveCert
}

// Edge makes the edge c describes, with log as its logger: it loads the TLS key pairs and
// the CA bundle the file names and makes the authenticator of its tokens. It opens and
// connects nothing (cluster.New does not connect). Its error names the file.
func (c *Server) Edge(log *zap.Logger) (*Edge, error) {
	e := &Edge{File: c.File, start: c, last: c, AdminToken: c.Auth.AdminToken, StateDir: c.Server.StateDir,
		AdminAddr: c.Server.AdminAddr(), AdminHosts: c.Server.AdminHosts}
	sc := c.serverConfig()
	sc.Logger = log
	if c.Auth.RequireAuth {
		auth, err := c.Auth.authenticator()
		if err != nil {
			return nil, fmt.Errorf("%s: auth: %w", c.File, err)
		}
		e.auth = newLiveAuth(auth)
		sc.Auth = e.auth
	}
	if c.Cluster != nil {
		cc, err := c.Cluster.config(true)
		if err != nil {
			return nil, fmt.Errorf("%s: cluster: %w", c.File, err)
		}
		e.ClusterConfig = &cc
		if sc.Cluster, err = cluster.New(cc); err != nil {
			return nil, fmt.Errorf("%s: %w", c.File, err)
		}
	}
	if c.TLS.Enabled() {
		cert, err := tls.LoadX509KeyPair(c.TLS.CertPath, c.TLS.KeyPath)
		if err != nil {
			return nil, fmt.Errorf("%s: tls: loading cert_path and key_path: %w", c.File, err)
		}
		e.cert = newLiveCert(cert)
		sc.TLSConfig = &tls.Config{GetCertificate: e.cert.get, MinVersion: tls.VersionTLS12}
	}
	e.Config = sc.WithDefaults()
	return e, nil
}

// LoadEdge reads the server.toml at path and makes its edge (LoadServer, then
// (*Server).Edge).
func LoadEdge(path string, log *zap.Logger) (*Edge, error) {
	c, err := LoadServer(path)
	if err != nil {
		return nil, err
	}
	return c.Edge(log)
}

// serverConfig maps the file onto the library's configuration: every key that sets a field
// of tunnel.ServerConfig sets it here, and nothing else does. Auth, TLS and the cluster are
// left to Edge, which loads what they need.
func (c *Server) serverConfig() tunnel.ServerConfig {
	s, l, lb := c.Server, c.Limits, c.LoadBalancing
	sc := tunnel.ServerConfig{
		Domain:      s.Domain,
		RegionID:    s.RegionID,
		ControlAddr: s.Addr(s.ControlPort),
		QUICAddr:    s.Addr(s.QUICPort),
		Public: tunnel.PublicHTTP{
			HTTPAddr:        s.Addr(s.HTTPPort),
			HTTPSAddr:       s.Addr(s.HTTPSPort),
			URLHTTPPort:     s.HTTPPort,
			URLHTTPSPort:    s.HTTPSPort,
			H2C:             s.H2C,
			TrustedProxies:  prefixes(s.TrustedProxies),
			WebSocketPath:   s.WebSocketPath,
			WebSocketOnHTTP: s.WebSocketOnHTTP,
		},
		RequestBody: tunnel.RequestBodyLimits{
			MaxBytes:     l.RequestBodyMaxBytes,
			Timeout:      orNoLimit(l.RequestBodyTimeout),
			MinRate:      orNoLimit(l.RequestBodyMinRate),
			MinRateGrace: l.RequestBodyMinRateGrace,
		},
		StalledResponses: tunnel.StalledResponseLimits{
			Timeout:         orNoLimit(l.ResponseStallTimeout),
			MaxBytes:        orNoLimit(l.MaxStalledResponseBytes),
			MaxBytesPerConn: orNoLimit(l.MaxStalledResponseBytesPerConn),
			MaxBytesPerIP:   orNoLimit(l.MaxStalledResponseBytesPerIP),
		},
		TCP: tunnel.TCPTunnels{
			Ports:          group.PortRange{Lo: l.TCPPortRange.Low, Hi: l.TCPPortRange.High},
			BindHost:       s.Bind.String(),
			DataReadBuffer: s.DataReadBuffer,
		},
		LoadBalancing: tunnel.LoadBalancing{
			Enabled:                lb.Enabled,
			Strategy:               lb.Strategy,
			RetryUnreadRequests:    lb.RetryUnreadRequests,
			RetryIdempotent:        lb.RetryIdempotent,
			MaxConcurrentPerMember: l.MaxConcurrentPerMember,
			PreferLocalStreams:     lb.PreferLocalStreams,
		},
		Timeouts: tunnel.Timeouts{Drain: l.DrainTimeout},
		PreAuth: tunnel.PreAuthLimits{
			HelloTimeout:         l.HelloTimeout,
			MaxConns:             l.MaxPreAuthConns,
			MaxConnsPerIP:        l.MaxPreAuthConnsPerIP,
			MaxAuthFailuresPerIP: l.MaxAuthFailuresPerIP,
			AuthFailureWindow:    l.AuthFailureWindow,
			AuthBlockDuration:    l.AuthBlock,
		},
		Limits: c.limits(),
		Alerts: tunnel.Alerts{
			WebhookURL:           lb.AlertWebhookURL,
			AllowPrivateWebhooks: lb.AllowPrivateAlertWebhooks,
			MinInterval:          lb.AlertMinInterval,
			OnRecovery:           lb.AlertOnRecovery,
		},
		RouteTTL:  l.RouteTTL,
		Endpoints: c.endpoints(),
	}
	if lb.OutlierEjection {
		sc.LoadBalancing.OutlierEjection = &group.DefaultEjection
	}
	return sc
}

// limits are the file's limits that the edge applies live: [limits]' own, every tenant's
// default quotas and each tenant's.
func (c *Server) limits() tunnel.Limits {
	lim := tunnel.Limits{MaxTunnelsPerSession: c.Limits.MaxTunnelsPerSession, Tenant: c.Limits.Quotas.tenantLimits()}
	for _, t := range c.Auth.Tenants {
		if t.Quotas != (Quotas{}) {
			if lim.PerTenant == nil {
				lim.PerTenant = map[string]tunnel.TenantLimits{}
			}
			lim.PerTenant[t.Name] = t.Quotas.tenantLimits()
		}
	}
	return lim
}

// endpoints are the [[endpoints]] entries as the library's.
func (c *Server) endpoints() []tunnel.Endpoint {
	var eps []tunnel.Endpoint
	for _, ep := range c.Endpoints {
		eps = append(eps, tunnel.Endpoint{
			Subdomain: ep.Subdomain,
			Proto:     tunnel.Proto(ep.Proto),
			Port:      ep.Port,
			Tenant:    ep.Tenant,
			Group:     ep.Group,
			KeyHash:   keyHash(ep.KeySHA256),
			Policy: tunnel.Policy{
				AllowCIDRs:    prefixes(ep.AllowCIDRs),
				DenyCIDRs:     prefixes(ep.DenyCIDRs),
				RateLimit:     ep.RateLimit,
				RateBurst:     ep.RateBurst,
				MaxConcurrent: ep.MaxConcurrent,
			},
		})
	}
	return eps
}

// tenantLimits are the file's quotas as the library's.
func (q Quotas) tenantLimits() tunnel.TenantLimits {
	return tunnel.TenantLimits{MaxSessions: q.MaxSessions, MaxTunnels: q.MaxTunnels,
		MaxTCPPorts: q.MaxTCPPorts, MaxEventStreams: q.MaxEventStreams, MaxRoutes: q.MaxRoutes}
}

// authenticator checks the connector tokens and the tenants' tokens of the [auth] table.
func (a Auth) authenticator() (*tunnel.StaticTokens, error) {
	tenants := make(map[string]string, len(a.Tenants))
	for _, t := range a.Tenants {
		tenants[t.Name] = t.Token
	}
	return tunnel.NewStaticTokens(a.Tokens, tenants)
}

// config maps the [cluster] table onto the library's cluster configuration; with
// loadTLS it loads the edge-to-edge TLS files too (validation does without).
func (c *Cluster) config(loadTLS bool) (cluster.Config, error) {
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
	if !loadTLS || !c.TLS.Enabled() {
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

// clusterConfig is the [cluster] table as the library checks it.
func (c *Server) clusterConfig() cluster.Config {
	cc, _ := c.Cluster.config(false)
	return cc
}

// orNoLimit turns the file's 0 (no limit) into the library's: a negative value (its 0 means
// the default).
func orNoLimit[T time.Duration | int64](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

// liveAuth is the edge's Authenticator: it checks tokens against the set last loaded, which
// Reload replaces.
type liveAuth struct {
	cur atomic.Pointer[tunnel.StaticTokens]
}

func newLiveAuth(st *tunnel.StaticTokens) *liveAuth {
	a := &liveAuth{}
	a.cur.Store(st)
	return a
}

// Authenticate implements tunnel.Authenticator.
func (a *liveAuth) Authenticate(ctx context.Context, token string) (string, error) {
	return a.cur.Load().Authenticate(ctx, token)
}

// liveCert hands out the certificate last loaded (tls.Config.GetCertificate), which Reload
// replaces.
type liveCert struct {
	cur atomic.Pointer[tls.Certificate]
}

func newLiveCert(c tls.Certificate) *liveCert {
	l := &liveCert{}
	l.cur.Store(&c)
	return l
}

func (l *liveCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) { return l.cur.Load(), nil }
