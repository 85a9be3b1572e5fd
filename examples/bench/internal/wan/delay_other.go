//go:build !linux

package wan

import (
	"context"
	"errors"
	"time"
)

var errNotLinux = errors.New("wan: WAN link simulation needs Linux (network namespaces, NFQUEUE)")

// delayer is a stand-in: Delay is not available off Linux.
type delayer struct{ final stats }

// Stop never runs: startDelay returns no delayer off Linux.
func (d *delayer) Stop() error { return errNotLinux }

func (d *delayer) setLoss(float64) {}

func startDelay(_ context.Context, port int, oneWay time.Duration, loss float64) (*delayer, error) {
	if err := validateDelay(port, oneWay, loss); err != nil {
		return nil, err
	}
	return nil, errNotLinux
}

func probeNFQueue() error { return errNotLinux }
