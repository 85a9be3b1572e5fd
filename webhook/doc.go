// Package webhook sends best-effort JSON alerts when a load-balancing group
// reaches zero healthy members.
//
// It holds three independent pieces that the edge wires together:
//
//   - [Debouncer] turns a stream of "group G now has N healthy members"
//     observations into alerts. By default it follows the alert document's
//     rule: a group_zero_healthy alert each time a group falls to zero
//     healthy members after having had at least one, sent at once, however
//     often the group flaps, and none while it stays down. Two opt-ins
//     change that: a group_recovered alert when a group has a healthy
//     member again (DebouncerConfig.Recovery), and a minimum interval
//     between two alerts of a group (DebouncerConfig.MinInterval), which
//     holds back what happens inside it and reports it when it ends.
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
