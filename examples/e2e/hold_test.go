package e2e

import (
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHoldEndsOnFirstCtrlC: "demo -hold" and "cluster -hold" hold with everything up until
// one SIGINT, then shut down, exit 0 within a bound and leave no temporary directory (the
// cluster demo's NATS store).
func TestHoldEndsOnFirstCtrlC(t *testing.T) {
	for _, name := range []string{"demo", "cluster"} {
		t.Run(name, func(t *testing.T) {
			p := start(t, name, name, "-hold")
			p.line(t, "press Ctrl-C to stop")
			var store string
			if name == "cluster" {
				m := regexp.MustCompile(`\(store (\S+)\)`).FindStringSubmatch(p.stdout.String())
				require.NotNil(t, m, p.stdout.String())
				store = m[1]
				require.DirExists(t, store, "the NATS store exists while the cluster holds")
			}
			p.signal(t, os.Interrupt)
			sent := time.Now()
			require.Equal(t, 0, p.wait(t), "exit code; stderr: %s", p.stderr.String())
			require.Less(t, time.Since(sent), 10*time.Second, "the first Ctrl-C ends the hold")
			require.Contains(t, p.stdout.String(), "done in")
			if store != "" {
				require.NoDirExists(t, store, "the temporary directory is removed")
			}
		})
	}
}
