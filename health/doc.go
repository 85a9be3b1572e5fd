// Package health probes a connector's local backend and reports changes in
// its health.
//
// A [Spec] describes one check: a TCP connect ([TypeTCP]), an HTTP/1.0 GET
// whose status line is read ([TypeHTTP]), or an in-process function
// ([TypeFunc]). [Spec.Probe] runs a single probe; a [Prober] runs probes
// periodically against one target and calls a report callback only when the
// target's state changes:
//
//   - the first success reports healthy;
//   - MaxFailed consecutive failures report unhealthy (once);
//   - after that, the next success reports healthy again.
//
// A success between failures resets the failure count, and a steady state
// reports nothing. The package knows nothing about tunnels or the wire
// protocol: whoever owns a Prober turns its reports into whatever messages
// the edge needs.
//
// The defaults ([DefaultInterval], [DefaultTimeout], [DefaultMaxFailed]) are a
// probe every 10 s with a 3 s timeout, unhealthy after 3 consecutive failures;
// [TCPReadiness] returns a faster TCP readiness check (every 3 s, 400 ms
// timeout, unhealthy after 2 failures).
package health
