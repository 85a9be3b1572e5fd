// Package webhook sends best-effort JSON alerts when a load-balancing group
// reaches zero healthy members, and when it recovers.
//
// It holds three independent pieces that the edge wires together:
//
//   - [Debouncer] turns a stream of "group G now has N healthy members"
//     observations into alerts: a group_zero_healthy alert when a group
//     falls to zero healthy members after having had at least one, a
//     group_recovered alert when it has one again, and at most one alert
//     per group per minimum interval however fast the group flaps. A change
//     held back by the interval is reported when the interval ends, with
//     the group's state at that moment: while a group exists, the last
//     alert a receiver got is at most one interval out of date.
//   - [Destinations] and [ValidateURL] build the fan-out list for one alert:
//     the operator URL (trusted) plus the unique per-tenant URLs collected
//     from the group's members (untrusted).
//   - [Sender] POSTs a [Payload] to every destination from a fixed pool of
//     workers. Delivery is best effort: one attempt per destination, a
//     per-request timeout, no retry. Each destination has its own bounded
//     queue that drops rather than blocks, so a slow or hanging receiver
//     delays and drops only its own alerts. Tenant destinations are checked
//     at dial time so they cannot reach addresses that are not globally
//     reachable (loopback, private, carrier-grade NAT, link-local, ...).
//
// The package knows nothing about tunnels or the wire protocol.
package webhook
