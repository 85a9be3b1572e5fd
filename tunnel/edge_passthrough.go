package tunnel

import (
	"fmt"

	"github.com/warren-tunnel/warren/group"
)

// checkRoute checks a registration's route before it is claimed: a subdomain for http,
// https and tls tunnels, and for tls an edge that has a TLS configuration, without which
// ServePublicTLS, the only way to a TLS passthrough tunnel, cannot serve.
func checkRoute(proto group.Proto, label string, servesHTTPS bool) error {
	if proto == group.ProtoTLS && !servesHTTPS {
		return &group.Error{Err: ErrInvalid, Msg: "this edge serves no HTTPS (it has no TLS configuration): " +
			"a tls passthrough tunnel could not be reached"}
	}
	if proto.BySubdomain() {
		return validSubdomain(label)
	}
	return nil
}

// validSubdomain accepts one DNS label: a-z, 0-9 and '-', 1 to 63 characters, not starting
// or ending with '-'.
func validSubdomain(s string) error {
	if group.ValidateSubdomain(s) != nil {
		return &group.Error{Err: ErrInvalid, Msg: fmt.Sprintf("invalid subdomain %q: use 1 to 63 letters, digits or '-'", s)}
	}
	return nil
}
