package edgecmd

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/admin"
	"github.com/warren-tunnel/warren/tunnel/config"
)

// Listeners are the edge's bound listeners, not yet served: binding them all first lets the
// program write its pid file only once the edge listens, and fail before it when a port is
// taken.
type Listeners struct {
	serves []func() error
	closes []func()
	plane  *admin.Plane
}

// Listen binds every listener of edge (control, public HTTP and HTTPS, the cluster's peer
// listener, the admin plane), as tunnel.Server.ListenAndServe would, logging each.
func Listen(srv *tunnel.Server, edge *config.Edge, log *zap.Logger) (*Listeners, error) {
	sc := edge.Config
	ls := &Listeners{}
	add := func(name, addr string, secure bool, wrap func(net.Listener) net.Listener, serve func(net.Listener) error) error {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen %s (%s): %w", addr, name, err)
		}
		log.Info("listening", zap.String("listener", name), zap.Stringer("addr", l.Addr()), zap.Bool("tls", secure))
		if wrap != nil {
			l = wrap(l)
		}
		ls.closes = append(ls.closes, func() { _ = l.Close() })
		ls.serves = append(ls.serves, func() error { return serve(l) })
		return nil
	}
	var err error
	if sc.TLSConfig != nil {
		err = add("control", sc.ControlAddr, true, func(l net.Listener) net.Listener { return tls.NewListener(l, sc.TLSConfig) }, srv.Serve)
		if err == nil && sc.Public.HTTPSAddr != "" {
			err = add("https", sc.Public.HTTPSAddr, true, nil, srv.ServePublicTLS)
		}
	} else {
		err = add("control", sc.ControlAddr, false, nil, srv.Serve)
	}
	if err == nil && sc.Public.HTTPAddr != "" {
		err = add("http", sc.Public.HTTPAddr, false, nil, srv.ServePublic)
	}
	if err == nil && sc.QUICAddr != "" {
		err = ls.listenQUIC(srv, sc.QUICAddr, log)
	}
	if err == nil && sc.Cluster != nil {
		err = add("peers", sc.Cluster.PeerAddr(), false, nil, sc.Cluster.ServePeers)
	}
	if err == nil && edge.AdminAddr != "" {
		var plane *admin.Plane
		plane, err = admin.New(srv, admin.Options{Token: edge.AdminToken, Hosts: edge.AdminHosts, Logger: log.Named("admin")})
		if err == nil {
			ls.plane = plane
			err = add("admin", edge.AdminAddr, false, nil, func(l net.Listener) error { return srv.ServeAdmin(l, plane.Handler()) })
		}
	}
	if err != nil {
		ls.Close()
		return nil, err
	}
	return ls, nil
}

// listenQUIC binds the UDP socket connectors reach the edge on over QUIC ([server] quic_port).
func (ls *Listeners) listenQUIC(srv *tunnel.Server, addr string, log *zap.Logger) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("listen %s (quic): %w", addr, err)
	}
	log.Info("listening", zap.String("listener", "quic"), zap.Stringer("addr", pc.LocalAddr()), zap.Bool("tls", true))
	ls.closes = append(ls.closes, func() { _ = pc.Close() })
	ls.serves = append(ls.serves, func() error { return tunnel.ServeQUIC(srv, pc) })
	return nil
}

// Serve serves every listener, each in a goroutine that sends its end to served; it
// returns how many will.
func (ls *Listeners) Serve(served chan<- error) int {
	for _, serve := range ls.serves {
		go func() { served <- serve() }()
	}
	n := len(ls.serves)
	ls.serves, ls.closes = nil, nil // the server owns them now
	return n
}

// Close closes listeners not yet served and the admin plane.
func (ls *Listeners) Close() {
	for _, c := range ls.closes {
		c()
	}
	ls.closes = nil
	if ls.plane != nil {
		ls.plane.Close()
	}
}

// ApplyReload is SIGHUP: it reads the file at path again and applies it to srv, logging
// what it applied and what it did not. A file that does not load, or that the edge
// refuses, changes nothing.
func ApplyReload(edge *config.Edge, srv *tunnel.Server, path string, log *zap.Logger) {
	log.Info("SIGHUP: reloading the configuration", zap.String("file", path))
	next, err := config.LoadServer(path)
	var changes []config.Change
	if err == nil {
		changes, err = edge.Reload(srv, next)
	}
	applied := 0
	for _, c := range changes {
		if c.Applied {
			log.Info("applied: " + c.String())
			applied++
		}
	}
	for _, c := range changes {
		if !c.Applied {
			log.Warn("not applied: " + c.String())
		}
	}
	if err != nil {
		log.Error("reload failed; the running configuration is kept", zap.String("errors", err.Error()))
		return
	}
	log.Info("configuration reloaded", zap.Int("applied", applied), zap.Int("not_applied", len(changes)-applied))
}

// ShutdownCounting is srv.Shutdown(ctx), logging the streams still open as they finish.
func ShutdownCounting(ctx context.Context, srv *tunnel.Server, log *zap.Logger) error {
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }()
	count := func() int64 {
		var n int64
		for _, g := range srv.Registry().Groups() {
			for _, m := range g.Members {
				n += m.Active
			}
		}
		return n
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	last := int64(-1)
	for {
		if n := count(); n != last {
			last = n
			streams := "streams"
			if n == 1 {
				streams = "stream"
			}
			log.Info(fmt.Sprintf("draining: %d %s left", n, streams), zap.Int64("streams_left", n))
		}
		select {
		case err := <-done:
			if err == nil && last != 0 {
				log.Info("draining: 0 streams left", zap.Int64("streams_left", 0))
			}
			return err
		case <-tick.C:
		}
	}
}
