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
)

// Config makes an edge one of several that share their routes and pools through a
// NATS server (or cluster) with JetStream. Every edge of a cluster names the same NATS
// servers, Bucket prefix and Token. See the README's "Cluster" section for what it does and
// RELIABILITY.md for what holds while NATS or an edge is lost.
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
	// within it. Renewed every third of it. Default 10 s.
	LeaseTTL time.Duration
	// Bucket prefixes the JetStream key-value buckets: <Bucket>_routes, <Bucket>_members,
	// <Bucket>_leases, <Bucket>_alerts. Default "warren".
	Bucket string
	// Replicas is the replica count of buckets the edge creates (3 in a 3-node NATS
	// cluster, so that a node can be lost). Default 1.
	Replicas int
	// Timeout bounds each request to NATS. Default 5 s.
	Timeout time.Duration
}

const (
	defaultLeaseTTL     = 10 * time.Second
	defaultClusterTimer = 5 * time.Second
	maxEdgeIDLen        = 64
)

// validEdgeID accepts 1 to 64 of [A-Za-z0-9_-]: an edge id is a token of NATS keys.
func validEdgeID(id string) bool {
	if id == "" || len(id) > maxEdgeIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if !natsTokenChar(id[i]) {
			return false
		}
	}
	return true
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

// setDefaults validates c and fills in its defaults.
func (c *Config) setDefaults() error {
	if c.NATSConn == nil && len(c.NATSURLs) == 0 {
		return errors.New("cluster: nats_urls is empty")
	}
	if c.EdgeID == "" {
		c.EdgeID = defaultEdgeID()
	}
	if !validEdgeID(c.EdgeID) {
		return fmt.Errorf("cluster: edge_id %q: use 1 to %d letters, digits, '-' or '_'", c.EdgeID, maxEdgeIDLen)
	}
	if c.Advertise == "" {
		return errors.New("cluster: advertise (host:port other edges reach this edge on) is empty")
	}
	if _, port, err := net.SplitHostPort(c.Advertise); err != nil || port == "" || port == "0" {
		return fmt.Errorf("cluster: advertise %q is not host:port", c.Advertise)
	}
	if c.PeerAddr == "" {
		c.PeerAddr = c.Advertise
	}
	if strings.TrimSpace(c.Token) == "" {
		return errors.New("cluster: token is empty: edges authenticate each other with it")
	}
	if (c.PeerTLS == nil) != (c.PeerClientTLS == nil) {
		return errors.New("cluster: set both PeerTLS and PeerClientTLS, or neither")
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = defaultLeaseTTL
	}
	if c.LeaseTTL < 300*time.Millisecond {
		return fmt.Errorf("cluster: lease %v is too short (at least 300ms)", c.LeaseTTL)
	}
	if c.Bucket == "" {
		c.Bucket = "warren"
	}
	if !validEdgeID(c.Bucket) {
		return fmt.Errorf("cluster: bucket prefix %q: use letters, digits, '-' or '_'", c.Bucket)
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.Timeout <= 0 {
		c.Timeout = defaultClusterTimer
	}
	return nil
}
