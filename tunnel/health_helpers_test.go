package tunnel

import (
	"context"
	"errors"
	"time"

	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/internal/wire"
)

// healthSpecNeverPasses is a probe that always fails: its member never joins dispatch.
var healthSpecNeverPasses = health.Spec{
	Type:      health.TypeFunc,
	Interval:  20 * time.Millisecond,
	Timeout:   20 * time.Millisecond,
	MaxFailed: 1,
	Check:     func(context.Context) error { return errors.New("never healthy") },
}

func healthFrame(id string, healthy bool) wire.Message {
	return &wire.Health{TunnelID: id, Healthy: healthy, Reason: "spoofed"}
}

func drainFrame(id string) wire.Message { return &wire.Drain{TunnelID: id} }
