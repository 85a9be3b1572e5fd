package wire

import (
	"encoding/hex"
	"fmt"
	"slices"

	"github.com/warren-tunnel/warren/group"
)

// Message is one control frame's payload. The concrete types are the structs below.
type Message interface {
	// Type is the frame type the message travels as.
	Type() Type
	// Validate reports whether the fields are within the protocol's limits.
	Validate() error
}

// Hello is the connector's first frame on the control stream.
type Hello struct {
	Version int    `json:"version"`
	Token   string `json:"token,omitempty"`
	// Client names the connector software, for logs ("warren/0.1").
	Client string `json:"client,omitempty"`
	// ResumeSession and ResumeToken, sent on a reconnect, name the connector's previous
	// session and prove it owned it (the token came in that session's Welcome). If the edge
	// still holds that session (it has not noticed the connection died), it ends it first, so
	// that the connector's tunnels can register again at once.
	ResumeSession string `json:"resume_session,omitempty"`
	ResumeToken   string `json:"resume_token,omitempty"`
	// Features names the optional parts of the protocol the connector speaks (Feature*);
	// the edge uses none that the connector did not name, and ignores names it does not know.
	Features []string `json:"features,omitempty"`
}

// Optional protocol features a connector names in Hello.Features.
const (
	// FeatureStreamReset: the connector handles Reset frames, ending the data streams they
	// name and their backend connections at once.
	FeatureStreamReset = "stream_reset"
)

// MaxFeatures bounds Hello.Features; each name is at most MaxLabelLen bytes.
const MaxFeatures = 16

// HasFeature reports whether the Hello names feature f.
func (m *Hello) HasFeature(f string) bool { return slices.Contains(m.Features, f) }

// Welcome accepts a Hello.
type Welcome struct {
	Version   int    `json:"version"`
	SessionID string `json:"session_id"`
	RegionID  string `json:"region_id,omitempty"`
	// ResumeToken is the secret a later Hello presents to end this session (see Hello).
	ResumeToken string `json:"resume_token,omitempty"`
}

// Error codes carried by Error and Rejected. The connector maps them back to sentinel errors.
const (
	CodeUnauthorized       = "unauthorized"
	CodeUnsupportedVersion = "unsupported_version"
	CodeProtocol           = "protocol_error"
	CodeShuttingDown       = "shutting_down"
	CodeUnavailable        = "unavailable" // a transient failure (e.g. the authenticator): retry
	CodeKeyMismatch        = "group_key_mismatch"
	CodeInUse              = "in_use"
	CodeProtoMismatch      = "proto_mismatch"
	CodeNoPorts            = "no_ports"
	CodeLimit              = "limit"
	CodeInvalid            = "invalid"
	CodeOwned              = "route_owned"
	CodeInternal           = "internal"
)

// Error is a fatal, session-wide error; the edge closes the connection after sending it.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// HealthInfo describes a tunnel's health check as far as the edge needs it: whether the member
// starts unhealthy, what kind of probe reports on it, and where to alert.
type HealthInfo struct {
	// Kind is "tcp", "http" or "func", or "none" when the tunnel has no probe but carries
	// an alert webhook.
	Kind       string `json:"kind"`
	Path       string `json:"path,omitempty"`
	IntervalMS int64  `json:"interval_ms,omitempty"`
	TimeoutMS  int64  `json:"timeout_ms,omitempty"`
	MaxFailed  int    `json:"max_failed,omitempty"`
	// AlertWebhook is the tenant's URL to POST to when the tunnel's group reaches zero healthy
	// members. Only the edge holds it; no API returns it.
	AlertWebhook string `json:"alert_webhook,omitempty"`
}

// Register asks the edge to create or join a route.
type Register struct {
	// Req is chosen by the connector and echoed in Registered or Rejected.
	Req   uint32      `json:"req"`
	Proto group.Proto `json:"proto"`
	// Label is the subdomain for http, https and tls, and a display name for tcp (a
	// grouped TCP tunnel's route is its group name).
	Label string `json:"label"`
	// Group is the pool's display name; empty for a solo tunnel.
	Group string `json:"group,omitempty"`
	// KeyHash is the hex SHA-256 of the group key; required with Group. The raw key never
	// crosses the wire.
	KeyHash string      `json:"key_hash,omitempty"`
	Health  *HealthInfo `json:"health,omitempty"`
	// LB carries the tunnel's load-balancing settings; nil means the defaults (weight 1,
	// priority 0, no slow start, no affinity, no idempotent retry, no previous keys).
	LB *LBInfo `json:"lb,omitempty"`
	// BackendProtocol is what the member's backend speaks, for http and https tunnels:
	// BackendHTTP1 (the default, also "") or BackendH2C. It is the member's own: the
	// members of a pool need not agree.
	BackendProtocol string `json:"backend_protocol,omitempty"`
	// Name is the tunnel's own name (the key of its entry in the connector's file, or
	// TunnelSpec.Name) and Host the name of the machine the connector runs on: the edge
	// shows them beside the member's id, so that the members of a pool can be told apart.
	// Both are optional (a connector that predates them sends neither) and shown only: the
	// edge keeps them as CleanDisplay makes them, never refuses a registration for them.
	Name string `json:"name,omitempty"`
	Host string `json:"host,omitempty"`
}

// Limits of Register.Name and Register.Host as the edge keeps them (CleanDisplay): a
// DNS label's length for a name, a DNS name's for a host.
const (
	MaxNameLen = 63
	MaxHostLen = 253
)

// CleanDisplay is s as an edge keeps a connector's display string (Register.Name and
// Register.Host): each character other than an ASCII letter, digit, '.', '-' or '_' —
// markup, spaces, control and non-ASCII characters, invalid UTF-8 — becomes one '_', and
// the result is cut to its first n bytes. What is left is plain text in any page, log or
// header: a connector can neither inject markup nor make the edge keep more than n bytes.
func CleanDisplay(s string, n int) string {
	if len(s) > 4*n {
		s = s[:4*n] // a character is at most 4 bytes: the rest would be cut anyway
	}
	b := make([]byte, 0, min(len(s), n))
	for _, r := range s {
		if len(b) == n {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			b = append(b, byte(r))
		default:
			b = append(b, '_')
		}
	}
	return string(b)
}

// Backend protocols of an HTTP tunnel (Register.BackendProtocol).
const (
	// BackendHTTP1: the edge sends HTTP/1.1 to the backend, one request at a time per data
	// stream.
	BackendHTTP1 = "http1"
	// BackendH2C: the edge speaks HTTP/2 over cleartext (prior knowledge) to the backend,
	// many requests per data stream; gRPC needs it.
	BackendH2C = "h2c"
)

// MaxPrevKeys bounds the previous group keys one registration may present.
const MaxPrevKeys = 4

// LBInfo is a tunnel's load-balancing settings (see group.JoinRequest). The edge checks
// their ranges and answers an out-of-range value with Rejected "invalid".
type LBInfo struct {
	Weight          int    `json:"weight,omitempty"`
	Priority        int    `json:"priority,omitempty"`
	SlowStartMS     int64  `json:"slow_start_ms,omitempty"`
	Affinity        string `json:"affinity,omitempty"`
	RetryIdempotent bool   `json:"retry_idempotent,omitempty"`
	// PrevKeyHashes are the hex SHA-256 hashes of the group keys the connector held before
	// its current one (key rotation).
	PrevKeyHashes []string `json:"prev_key_hashes,omitempty"`
}

// Registered answers a Register that succeeded.
type Registered struct {
	Req      uint32 `json:"req"`
	TunnelID string `json:"tunnel_id"`
	// URL is the public URL (http/https) or "tcp://host:port".
	URL string `json:"url"`
	// Port is the public TCP port for tcp tunnels.
	Port int `json:"port,omitempty"`
	// Group is the pool's name as the first member set it; empty for solo tunnels.
	Group string `json:"group,omitempty"`
}

// Rejected answers a Register that failed; Message is the edge's words, shown to the user verbatim.
type Rejected struct {
	Req     uint32 `json:"req"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Health reports a change of a tunnel's health, sent only on edges of the probe state.
type Health struct {
	TunnelID string `json:"tunnel_id"`
	Healthy  bool   `json:"healthy"`
	Reason   string `json:"reason,omitempty"`
}

// Drain asks the edge to stop selecting a tunnel, let its open streams finish (bounded by the
// edge's drain timeout), then remove it and answer Deregistered.
type Drain struct {
	TunnelID string `json:"tunnel_id"`
}

// Deregister removes a tunnel at once.
type Deregister struct {
	TunnelID string `json:"tunnel_id"`
}

// Deregistered tells the connector a tunnel is gone.
type Deregistered struct {
	TunnelID string `json:"tunnel_id"`
	Reason   string `json:"reason,omitempty"`
}

// Reset tells the connector that the edge abandoned data streams: their public client went
// away or failed mid-exchange. yamux has no per-stream reset, and a closed stream is only
// half-closed: without this frame the connector would go on writing the backend's answer
// into a stream nobody reads, until the edge's window for it is full, and keep its backend
// connection open, for as long as yamux's stream close timeout. The connector ends each
// named stream and resets (RST) its backend connection. Streams are named by their yamux
// stream IDs; an ID the connector does not know (already ended) is ignored. Sent only to
// connectors that named FeatureStreamReset in their Hello.
type Reset struct {
	Streams []uint32 `json:"streams"`
}

// MaxResetStreams bounds the stream IDs in one Reset frame (a frame of them stays far below
// MaxFrameSize).
const MaxResetStreams = 1024

// Type implements Message.
func (*Hello) Type() Type { return TypeHello }

// Type implements Message.
func (*Welcome) Type() Type { return TypeWelcome }

// Type implements Message.
func (*Error) Type() Type { return TypeError }

// Type implements Message.
func (*Register) Type() Type { return TypeRegister }

// Type implements Message.
func (*Registered) Type() Type { return TypeRegistered }

// Type implements Message.
func (*Rejected) Type() Type { return TypeRejected }

// Type implements Message.
func (*Health) Type() Type { return TypeHealth }

// Type implements Message.
func (*Drain) Type() Type { return TypeDrain }

// Type implements Message.
func (*Deregister) Type() Type { return TypeDeregister }

// Type implements Message.
func (*Deregistered) Type() Type { return TypeDeregistered }

// Type implements Message.
func (*Reset) Type() Type { return TypeReset }

func maxLen(field, s string, n int) error {
	if len(s) > n {
		return fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrMalformed, field, len(s), n)
	}
	return nil
}

func nonEmpty(field, s string) error {
	if s == "" {
		return fmt.Errorf("%w: %s is empty", ErrMalformed, field)
	}
	return nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Validate implements Message.
func (m *Hello) Validate() error {
	if len(m.Features) > MaxFeatures {
		return fmt.Errorf("%w: %d features, at most %d", ErrMalformed, len(m.Features), MaxFeatures)
	}
	for _, f := range m.Features {
		if err := maxLen("feature", f, MaxLabelLen); err != nil {
			return err
		}
	}
	return firstErr(maxLen("token", m.Token, MaxTokenLen), maxLen("client", m.Client, MaxLabelLen),
		maxLen("resume_session", m.ResumeSession, MaxTunnelIDLen), maxLen("resume_token", m.ResumeToken, MaxTunnelIDLen))
}

// Validate implements Message.
func (m *Welcome) Validate() error {
	return firstErr(maxLen("session_id", m.SessionID, MaxTunnelIDLen), maxLen("region_id", m.RegionID, MaxLabelLen),
		maxLen("resume_token", m.ResumeToken, MaxTunnelIDLen))
}

// Validate implements Message.
func (m *Error) Validate() error {
	return firstErr(maxLen("code", m.Code, MaxLabelLen), maxLen("message", m.Message, MaxErrorMessage))
}

// Validate implements Message.
func (m *Register) Validate() error {
	switch m.Proto {
	case group.ProtoHTTP, group.ProtoHTTPS, group.ProtoTCP, group.ProtoTLS:
	default:
		return fmt.Errorf("%w: unknown proto %q", ErrMalformed, truncate(string(m.Proto), 16))
	}
	if err := firstErr(maxLen("label", m.Label, MaxLabelLen), maxLen("group", m.Group, MaxGroupLen)); err != nil {
		return err
	}
	if m.KeyHash != "" {
		if b, err := hex.DecodeString(m.KeyHash); err != nil || len(b) != 32 {
			return fmt.Errorf("%w: key_hash is not a hex SHA-256", ErrMalformed)
		}
	}
	if m.Group != "" && m.KeyHash == "" {
		return fmt.Errorf("%w: group %q without key_hash", ErrMalformed, m.Group)
	}
	switch m.BackendProtocol {
	case "", BackendHTTP1:
	case BackendH2C:
		if !m.Proto.IsHTTP() {
			return fmt.Errorf("%w: backend_protocol %q is for http and https tunnels", ErrMalformed, m.BackendProtocol)
		}
	default:
		return fmt.Errorf("%w: unknown backend_protocol %q (want http1 or h2c)", ErrMalformed, truncate(m.BackendProtocol, 16))
	}
	if h := m.Health; h != nil {
		switch h.Kind {
		case "none", "tcp", "http", "func":
		default:
			return fmt.Errorf("%w: unknown health kind %q", ErrMalformed, truncate(h.Kind, 16))
		}
		if h.IntervalMS < 0 || h.TimeoutMS < 0 || h.MaxFailed < 0 {
			return fmt.Errorf("%w: negative health setting", ErrMalformed)
		}
		if err := firstErr(maxLen("health.path", h.Path, MaxURLLen), maxLen("health.alert_webhook", h.AlertWebhook, MaxURLLen)); err != nil {
			return err
		}
	}
	if lb := m.LB; lb != nil {
		if err := maxLen("lb.affinity", lb.Affinity, MaxLabelLen+MaxGroupLen); err != nil {
			return err
		}
		if len(lb.PrevKeyHashes) > MaxPrevKeys {
			return fmt.Errorf("%w: %d previous key hashes, at most %d", ErrMalformed, len(lb.PrevKeyHashes), MaxPrevKeys)
		}
		for _, k := range lb.PrevKeyHashes {
			if b, err := hex.DecodeString(k); err != nil || len(b) != 32 {
				return fmt.Errorf("%w: a previous key hash is not a hex SHA-256", ErrMalformed)
			}
		}
		if len(lb.PrevKeyHashes) > 0 && m.Group == "" {
			return fmt.Errorf("%w: previous key hashes without a group", ErrMalformed)
		}
	}
	return nil
}

// Validate implements Message.
func (m *Registered) Validate() error {
	if m.Port < 0 || m.Port > 65535 {
		return fmt.Errorf("%w: port %d out of range", ErrMalformed, m.Port)
	}
	return firstErr(nonEmpty("tunnel_id", m.TunnelID), maxLen("tunnel_id", m.TunnelID, MaxTunnelIDLen),
		maxLen("url", m.URL, MaxURLLen), maxLen("group", m.Group, MaxGroupLen))
}

// Validate implements Message.
func (m *Rejected) Validate() error {
	return firstErr(maxLen("code", m.Code, MaxLabelLen), maxLen("message", m.Message, MaxErrorMessage))
}

// Validate implements Message.
func (m *Health) Validate() error {
	return firstErr(nonEmpty("tunnel_id", m.TunnelID), maxLen("tunnel_id", m.TunnelID, MaxTunnelIDLen),
		maxLen("reason", m.Reason, MaxReasonLen))
}

// Validate implements Message.
func (m *Drain) Validate() error {
	return firstErr(nonEmpty("tunnel_id", m.TunnelID), maxLen("tunnel_id", m.TunnelID, MaxTunnelIDLen))
}

// Validate implements Message.
func (m *Deregister) Validate() error {
	return firstErr(nonEmpty("tunnel_id", m.TunnelID), maxLen("tunnel_id", m.TunnelID, MaxTunnelIDLen))
}

// Validate implements Message.
func (m *Deregistered) Validate() error {
	return firstErr(nonEmpty("tunnel_id", m.TunnelID), maxLen("tunnel_id", m.TunnelID, MaxTunnelIDLen),
		maxLen("reason", m.Reason, MaxReasonLen))
}

// Validate implements Message.
func (m *Reset) Validate() error {
	if len(m.Streams) == 0 || len(m.Streams) > MaxResetStreams {
		return fmt.Errorf("%w: reset of %d streams, want 1 to %d", ErrMalformed, len(m.Streams), MaxResetStreams)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
