package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAdminBindNeedsRestart: a SIGHUP reports a changed admin_bind or allow_open_admin as
// not applied: the admin listener is bound once.
func TestAdminBindNeedsRestart(t *testing.T) {
	start := parse(t, "[server]\ndomain = \"localhost\"\n")
	next := parse(t, "[server]\ndomain = \"localhost\"\nadmin_bind = \"::1\"\nallow_open_admin = true\n")
	require.Equal(t, []string{
		"server.admin_bind (127.0.0.1 -> ::1): listeners and ports are fixed while the edge runs; restart the edge to apply it",
		"server.allow_open_admin (false -> true): the admin listener keeps the rule it started with; restart the edge to apply it",
	}, lines(fileDiff(start, next)))
	require.Empty(t, fileDiff(start, parse(t, "[server]\ndomain = \"localhost\"\nadmin_bind = \"127.0.0.1\"\n")), "the default written out is no change")
}
