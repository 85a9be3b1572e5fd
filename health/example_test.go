package health_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/warren-tunnel/warren/health"
)

// A prober for an in-process backend: it becomes ready on its first
// successful check and is reported unhealthy after two failures in a row.
func ExampleNewProber() {
	var probes atomic.Int32
	spec := health.Spec{
		Type:      health.TypeFunc,
		Interval:  time.Millisecond,
		MaxFailed: 2,
		Check: func(ctx context.Context) error {
			if probes.Add(1) <= 3 {
				return nil
			}
			return errors.New("backend not ready")
		},
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reports := 0
	p, err := health.NewProber(spec, "", func(r health.Report) {
		fmt.Printf("healthy=%v reason=%q\n", r.Healthy, r.Reason)
		if reports++; reports == 2 {
			cancel()
		}
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := p.Run(ctx); err != nil {
		fmt.Println(err)
	}
	// Output:
	// healthy=true reason="probe succeeded"
	// healthy=false reason="2 consecutive probe failures: backend not ready"
}

// A single HTTP probe against a backend that answers 503.
func ExampleSpec_Probe() {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer backend.Close()

	spec := health.Spec{Type: health.TypeHTTP, Path: "/healthz", Timeout: time.Second}
	err := spec.Probe(context.Background(), backend.Listener.Addr().String())
	fmt.Println(err, errors.Is(err, health.ErrHTTPStatus))

	spec.AnyStatus = true
	fmt.Println(spec.Probe(context.Background(), backend.Listener.Addr().String()))
	// Output:
	// health: http status 503 true
	// <nil>
}
