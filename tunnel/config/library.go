package config

import (
	"errors"
	"regexp"
	"strings"

	"github.com/warren-tunnel/warren/tunnel"
)

// The library checks what it enforces itself (tunnel.ServerConfig.Validate,
// tunnel.TunnelSpec.Validate, cluster.Config.Validate): this package maps the values of a
// file onto the library's, runs those checks and reports each *tunnel.FieldError they return
// as a problem of the key that set the field. A rule is written once, in the library; the
// file adds only what the library leaves to it (a key that must be written, a value 0 that
// the library would take as "the default", a reference to another part of the file).

// keyOf maps a field a library check names to the file key that sets it, and to a hint
// that a message saying the field is missing ends with; ok is false for a field no key
// sets, and the key is "" for one whose key a stricter rule of the file's checks.
type keyOf func(field string) (key, requiredHint string, ok bool)

// library reports the problems in err, the result of a library check, under the keys keyOf
// maps their fields to. A key already reported, or holding a key already reported, is left
// out: the library would only repeat it in its words. Each reported key is failed, so that
// the file's own rules about it say nothing more.
func (r *reporter) library(err error, keyOf keyOf) {
	for _, e := range flatten(err) {
		var fe *tunnel.FieldError
		if !errors.As(e, &fe) {
			r.add("", ErrInvalid, "%v", e)
			continue
		}
		key, hint, ok := keyOf(fe.Field)
		switch {
		case !ok:
			r.add("", ErrInvalid, "%v", fe)
			continue
		case key == "": // a stricter rule of the file's covers the field
			continue
		}
		if r.reported(key) {
			continue
		}
		sentinel := ErrInvalid
		if errors.Is(fe.Err, tunnel.ErrRequired) {
			sentinel = ErrRequired
		} else {
			hint = ""
		}
		msg := strings.TrimPrefix(strings.TrimPrefix(fe.Err.Error(), "webhook: "), "group: ")
		msg = goEndpoint.ReplaceAllStringFunc(msg, func(s string) string {
			key := "endpoints" + strings.TrimPrefix(s, "Endpoints")
			return key + r.lineNote(key)
		})
		r.fail(key, sentinel, "%s%s", msg, hint)
	}
}

// goEndpoint is an endpoint as the library's messages name it.
var goEndpoint = regexp.MustCompile(`\bEndpoints\[[0-9]+\]`)

// reported reports whether key, a key holding it or a key it holds has a problem already.
func (r *reporter) reported(key string) bool {
	for k := key; k != ""; k = parentKey(k) {
		if r.bad[k] {
			return true
		}
	}
	for k := range r.bad {
		if strings.HasPrefix(k, key+".") || strings.HasPrefix(k, key+"[") {
			return true
		}
	}
	return false
}

// flatten returns the errors joined in err (errors.Join), depth first.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// fieldKeys maps fields to keys under a prefix; a field of a sub-struct ("Health.Path") may
// have a key of its own, or be reported under its struct's.
type fieldKeys map[string]struct{ key, requiredHint string }

// under returns the keyOf of m, its keys under prefix.
func (m fieldKeys) under(prefix string) keyOf {
	return func(field string) (string, string, bool) {
		for f := field; f != ""; f, _ = cutLast(f) {
			if k, ok := m[f]; ok {
				key := prefix
				for _, part := range strings.Split(k.key, ".") {
					key = joinKey(key, part)
				}
				return key, k.requiredHint, true
			}
		}
		return "", "", false
	}
}

// cutLast drops the last part of a field path: "Health.Path" -> "Health".
func cutLast(field string) (string, string) {
	i := strings.LastIndexByte(field, '.')
	if i < 0 {
		return "", field
	}
	return field[:i], field[i+1:]
}

// serverFields are the fields of tunnel.ServerConfig that tunnel.ServerConfig.Validate
// names, by the key of server.toml that sets them.
var serverFields = fieldKeys{
	"TCP.Ports":              {key: "limits.tcp_port_range"},
	"LoadBalancing.Strategy": {key: "load_balancing.strategy"},
	"Alerts.WebhookURL":      {key: "load_balancing.alert_webhook_url"},
	"Public.WebSocketPath":   {key: "server.websocket_path"},
	"QUICAddr":               {key: "server.quic_port"},
	"Public.WebSocketOnHTTP": {key: "server.websocket_on_http"},
}

// endpointFields are the fields of tunnel.Endpoint, by the key of an [[endpoints]] entry.
var endpointFields = fieldKeys{
	"Subdomain": {key: "subdomain"}, "Proto": {key: "proto"}, "Port": {key: "port"}, "Tenant": {key: "tenant"},
	"Group": {key: "group"}, "KeyHash": {key: "key_sha256"}, "Policy.RateLimit": {key: "rate_limit"},
	"Policy.RateBurst": {key: "rate_burst"}, "Policy.MaxConcurrent": {key: "max_concurrent"},
}

// serverKey is the keyOf of tunnel.ServerConfig's fields in server.toml; an endpoint's are
// under endpoints[i], and the endpoint itself (a route reserved twice) is that key.
func serverKey(field string) (string, string, bool) {
	if rest, ok := strings.CutPrefix(field, "Endpoints["); ok {
		i, sub, _ := strings.Cut(rest, "]")
		base := "endpoints[" + i + "]"
		if sub == "" {
			return base, "", true
		}
		return endpointFields.under(base)(strings.TrimPrefix(sub, "."))
	}
	if rest, ok := strings.CutPrefix(field, "Public.TrustedProxies["); ok {
		return "server.trusted_proxies[" + rest, "", true
	}
	return serverFields.under("")(field)
}

// clusterKey is the keyOf of cluster.Config's fields in the [cluster] table.
var clusterKey = fieldKeys{
	"NATSURLs":  {key: "nats_urls", requiredHint: `, e.g. ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"]`},
	"EdgeID":    {key: "edge_id"},
	"Advertise": {key: "advertise", requiredHint: `, e.g. "10.0.0.5:7443"`},
	"PeerAddr":  {key: "peer_addr"},
	"Token":     {key: "token", requiredHint: " (e.g. the output of `openssl rand -hex 32`)"},
	"LeaseTTL":  {key: "lease_secs"},
	"Bucket":    {key: "bucket"},
	"Replicas":  {key: "replicas"},
	"Timeout":   {key: "timeout_secs"},
	"PeerTLS":   {key: "tls"},
}.under("cluster")

// tunnelFields are the fields of tunnel.TunnelSpec, by the key of a tunnel of the
// connector's file.
var tunnelFields = fieldKeys{
	"Proto": {key: "proto"}, "Subdomain": {key: "subdomain"}, "Group": {key: "group"},
	"GroupKey": {key: "group_key"}, "Health": {key: "health_check"}, "Health.Type": {key: "health_check.type"},
	"Health.Path": {key: "health_check.path"}, "AlertWebhook": {key: "health_check.alert_webhook"},
	"Weight": {key: "weight"}, "Priority": {key: "priority"}, "SlowStart": {key: "slow_start_secs"},
	"Affinity": {key: "affinity"}, "RetryIdempotent": {key: "retry_idempotent"},
	"PreviousGroupKeys": {key: "previous_group_keys"}, "BackendProtocol": {key: "backend_protocol"},
}

// tunnelKey is the keyOf of tunnel.TunnelSpec's fields in the tunnel at base. Its Name is
// the tunnel's own name, which the file checks by the stricter rule of a DNS label.
func tunnelKey(base string) keyOf {
	fields := tunnelFields.under(base)
	return func(field string) (string, string, bool) {
		if field == "Name" {
			return "", "", true
		}
		return fields(field)
	}
}
