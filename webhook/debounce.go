package webhook

import "sync"

// Debouncer detects zero-healthy edges per group. It is safe for concurrent
// use; the zero value is not usable, call [NewDebouncer].
//
// Each group has an "alerted" flag:
//
//   - An observation with healthy == 0 fires (Observe returns true) only when
//     the flag is clear, and then sets it. While the group stays at zero,
//     further observations do not fire.
//   - An observation with healthy > 0 clears the flag, so the next fall to
//     zero fires afresh. A flapping group fires once per downward edge.
//   - A group seen for the first time starts with its flag set: a pool that
//     has never had a healthy member did not "transition" to zero (members
//     with a health check start unhealthy), so it does not fire until it has
//     been healthy at least once.
//
// Negative counts are treated as zero.
type Debouncer struct {
	mu      sync.Mutex
	alerted map[string]bool
}

// NewDebouncer returns an empty Debouncer.
func NewDebouncer() *Debouncer {
	return &Debouncer{alerted: make(map[string]bool)}
}

// Observe records group's current healthy-member count and reports whether
// this observation is a downward edge to zero that must fire an alert.
func (d *Debouncer) Observe(group string, healthy int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	alerted, known := d.alerted[group]
	if !known {
		// Never seen: treat as already alerted (see the type's doc).
		alerted = true
	}
	if healthy > 0 {
		d.alerted[group] = false
		return false
	}
	d.alerted[group] = true
	return !alerted
}

// Forget drops a group's state, typically when the group is removed. A later
// Observe for the same name starts fresh, as a never-healthy group.
func (d *Debouncer) Forget(group string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.alerted, group)
}
