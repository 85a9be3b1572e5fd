package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/warren-tunnel/warren/group"
)

// describe turns an edge event into a sentence.
func describe(ev group.Event, names *sync.Map) string {
	who := "a new member"
	if name, ok := names.Load(ev.Member.ID); ok {
		who = "backend " + name.(string)
	}
	switch {
	case ev.Kind == group.EventJoined:
		return fmt.Sprintf("%s joined group %q (%d of %d healthy): %s", who, ev.Group.Name, ev.HealthyCount, ev.MemberCount, ev.Reason)
	case ev.Kind == group.EventHealth:
		state := map[bool]string{true: "healthy", false: "UNHEALTHY"}[ev.Healthy]
		return fmt.Sprintf("%s is %s (%d of %d healthy): %s", who, state, ev.HealthyCount, ev.MemberCount, ev.Reason)
	case ev.Kind == group.EventDraining:
		return fmt.Sprintf("%s is draining: no new requests (%d of %d members take traffic)", who, ev.SelectableCount, ev.MemberCount)
	case ev.GroupRemoved:
		return fmt.Sprintf("%s left; group %q is gone", who, ev.Group.Name)
	default:
		return fmt.Sprintf("%s %s (%d remaining)", who, ev.Kind, ev.MemberCount)
	}
}

// waitFor waits until the edge reports an event matching ok.
func waitFor(ctx context.Context, events <-chan group.Event, what string, ok func(group.Event) bool) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		select {
		case ev := <-events:
			if ok(ev) {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		}
	}
}

// checkStatusPage checks that the edge's admin listener serves its status page.
func checkStatusPage(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("status page: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		return fmt.Errorf("status page: %s, %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	return nil
}

// get sends one request and returns the name of the backend that answered.
func get(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %s", resp.Status)
	}
	return strings.TrimPrefix(strings.TrimSpace(string(body)), "hello from backend "), err
}

// backend is a plain net/http server that says which one it is.
type backend struct {
	name, addr string
	srv        *http.Server
	done       chan struct{} // closed when srv's Serve has returned
}

func (b *backend) start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("backend %s: %w", b.name, err)
	}
	b.addr, b.done = ln.Addr().String(), make(chan struct{})
	b.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "hello from backend %s\n", b.name)
	})}
	go func() { defer close(b.done); _ = b.srv.Serve(ln) }()
	return nil
}

// stop closes the server and waits for it; it is idempotent.
func (b *backend) stop() {
	if b.srv != nil {
		_ = b.srv.Close()
		<-b.done
		b.srv = nil
	}
}
