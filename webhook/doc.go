// Package webhook sends best-effort JSON alerts when a load-balancing group
// reaches zero healthy members.
//
// It holds three independent pieces that the edge wires together:
//
//   - [Debouncer] turns a stream of "group G now has N healthy members"
//     observations into downward edges: it reports true exactly once each
//     time a group falls to zero healthy members after having had at least
//     one, and stays quiet while the group remains down.
//   - [Destinations] and [ValidateURL] build the fan-out list for one alert:
//     the operator URL (trusted) plus the unique per-tenant URLs collected
//     from the group's members (untrusted).
//   - [Sender] POSTs a [Payload] to every destination from a small, bounded
//     pool of workers. Delivery is best effort: one attempt per destination,
//     a per-request timeout, no retry, and a bounded queue that drops rather
//     than blocks. Tenant destinations are checked at dial time so they
//     cannot reach loopback, private or link-local addresses.
//
// The package knows nothing about tunnels or the wire protocol.
package webhook
