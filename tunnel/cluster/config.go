package cluster

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/warren-tunnel/warren/tunnel"
)

// Config makes an edge one of several that share their routes and pools through a
// NATS server (or cluster) with JetStream. Every edge of a cluster names the same NATS
// servers, Bucket prefix and Token. See docs/cluster.md for what it does and
// docs/reliability.md for what holds while NATS or an edge is lost.
type Config struct {
	// NATSURLs are the NATS servers ("nats://host:4222"); the client fails over between
	// them. Required unless NATSConn is set.
	NATSURLs []string
	// NATSConn, when set, is the connection to use instead of dialling NATSURLs (embedders
	// and tests). The edge does not close it.
	NATSConn *nats.Conn
	// NATSOptions are extra options for the NATS connection the edge dials (credentials,
	// TLS to NATS).
	NATSOptions []nats.Option
	// EdgeID names this edge in the cluster: in member lists, /api/cluster and its lease.
	// 1 to 64 of [A-Za-z0-9_-]. Default: the host name, other characters replaced by '-'.
	EdgeID string
	// Advertise is the host:port other edges dial to reach this edge's edge-to-edge
	// listener. Required.
	Advertise string
	// PeerAddr is the address ListenAndServe listens on for other edges. Default: Advertise.
	PeerAddr string
	// Token authenticates edges to each other on their links; every edge of a cluster has
	// the same one. Required.
	Token string
	// PeerTLS, when set, wraps the edge-to-edge listener in TLS; PeerClientTLS is the
	// client side (its RootCAs verify the other edges; ServerName is taken from each
	// edge's advertised host when empty). Set both or neither.
	PeerTLS, PeerClientTLS *tls.Config
	// LeaseTTL is how long an edge's lease lasts without a renewal: an edge that stops
	// (kill -9, lost its NATS connection) has its members leave every other edge's view
	// within it. Renewed every third of it. Default 10 s (DefaultLeaseTTL), at least
	// MinLeaseTTL.
	LeaseTTL time.Duration
	// Bucket prefixes the JetStream key-value buckets: <Bucket>_routes, <Bucket>_members,
	// <Bucket>_leases, <Bucket>_alerts: 1 to 64 of [A-Za-z0-9_-]. Default "warren"
	// (DefaultBucket).
	Bucket string
	// Replicas is the replica count of buckets the edge creates (3 in a 3-node NATS
	// cluster, so that a node can be lost). Default 1, at most MaxReplicas.
	Replicas int
	// Timeout bounds each request to NATS. Default 5 s (DefaultTimeout).
	Timeout time.Duration
}

// Defaults and bounds of Config.
const (
	// DefaultLeaseTTL is Config.LeaseTTL's default.
	DefaultLeaseTTL = 10 * time.Second
	// MinLeaseTTL is the shortest Config.LeaseTTL: renewed every third of it, a shorter
	// lease would expire on an ordinary pause of the edge or of NATS.
	MinLeaseTTL = 300 * time.Millisecond
	// DefaultTimeout is Config.Timeout's default.
	DefaultTimeout = 5 * time.Second
	// DefaultBucket is Config.Bucket's default.
	DefaultBucket = "warren"
	// DefaultReplicas is Config.Replicas' default.
	DefaultReplicas = 1
	// MaxReplicas is the most replicas a JetStream bucket may have (Config.Replicas).
	MaxReplicas = 5
	// MaxEdgeIDLength is the longest Config.EdgeID (and Config.Bucket).
	MaxEdgeIDLength = 64
)

// maxEdgeIDLen is MaxEdgeIDLength, as the peer handshake reads it.
const maxEdgeIDLen = MaxEdgeIDLength

// nameProblem says why id cannot be an edge id or a bucket prefix (a token of NATS keys: 1
// to 64 of [A-Za-z0-9_-]), or returns "".
func nameProblem(id string) string {
	if id == "" || len(id) > MaxEdgeIDLength {
		return fmt.Sprintf("%q must be 1 to %d characters long", id, MaxEdgeIDLength)
	}
	for i := 0; i < len(id); i++ {
		if !natsTokenChar(id[i]) {
			return fmt.Sprintf("%q may hold only letters, digits, \"-\" and \"_\"", id)
		}
	}
	return ""
}

func natsTokenChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// defaultEdgeID is the host name with every character an edge id cannot hold replaced.
func defaultEdgeID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "edge"
	}
	b := []byte(h)
	for i, c := range b {
		if !natsTokenChar(c) {
			b[i] = '-'
		}
	}
	if len(b) > maxEdgeIDLen {
		b = b[:maxEdgeIDLen]
	}
	return string(b)
}

// Validate reports the settings of c that New refuses, each a *tunnel.FieldError naming the
// field ("EdgeID", "LeaseTTL"; joined when there are several), or returns nil. Zero
// settings take their defaults and are not refused. It connects nothing.
func (c Config) Validate() error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, &tunnel.FieldError{Field: field, Err: fmt.Errorf(format, args...)})
	}
	if c.NATSConn == nil && len(c.NATSURLs) == 0 {
		add("NATSURLs", "%w: the NATS servers the edges share", tunnel.ErrRequired)
	}
	if c.EdgeID != "" {
		if p := nameProblem(c.EdgeID); p != "" {
			add("EdgeID", "%s", p)
		}
	}
	if c.Advertise == "" {
		add("Advertise", "%w: the host:port the other edges reach this edge on", tunnel.ErrRequired)
	} else if _, port, err := net.SplitHostPort(c.Advertise); err != nil || port == "" || port == "0" {
		add("Advertise", "%q is not host:port", c.Advertise)
	}
	if strings.TrimSpace(c.Token) == "" {
		add("Token", "%w: the secret every edge of the cluster presents to the others", tunnel.ErrRequired)
	}
	if (c.PeerTLS == nil) != (c.PeerClientTLS == nil) {
		add("PeerTLS", "set both PeerTLS and PeerClientTLS, or neither")
	}
	if c.LeaseTTL > 0 && c.LeaseTTL < MinLeaseTTL {
		add("LeaseTTL", "must be at least %s, got %s", MinLeaseTTL, c.LeaseTTL)
	}
	if c.Bucket != "" {
		if p := nameProblem(c.Bucket); p != "" {
			add("Bucket", "%s", p)
		}
	}
	if c.Replicas > MaxReplicas {
		add("Replicas", "must be at most %d (JetStream's limit), got %d", MaxReplicas, c.Replicas)
	}
	return errors.Join(errs...)
}

// setDefaults validates c and fills in its defaults.
func (c *Config) setDefaults() error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if c.EdgeID == "" {
		c.EdgeID = defaultEdgeID()
	}
	if c.PeerAddr == "" {
		c.PeerAddr = c.Advertise
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.Bucket == "" {
		c.Bucket = DefaultBucket
	}
	if c.Replicas <= 0 {
		c.Replicas = DefaultReplicas
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	return nil
}
