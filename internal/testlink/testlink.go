// Package testlink holds test helpers shared by the packages of the data path. It is imported
// by tests only.
package testlink

import (
	"bytes"
	"net"
	"sync"
)

// Held is a connector's connection to the edge whose bytes towards the edge can be held
// back, as a long link delays them, while the connector goes on: its writes return at once,
// and the bytes go out in order once released.
type Held struct {
	net.Conn
	mu     sync.Mutex
	cond   *sync.Cond
	queue  [][]byte
	held   bool
	closed bool
	done   chan struct{}
}

// NewHeld wraps c; Close ends its pump goroutine.
func NewHeld(c net.Conn) *Held {
	l := &Held{Conn: c, done: make(chan struct{})}
	l.cond = sync.NewCond(&l.mu)
	go l.pump()
	return l
}

// Write queues p for the pump and returns at once.
func (l *Held) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, net.ErrClosed
	}
	l.queue = append(l.queue, bytes.Clone(p))
	l.cond.Broadcast()
	return len(p), nil
}

// Hold holds the connector's bytes back (on) or lets them go (off).
func (l *Held) Hold(on bool) {
	l.mu.Lock()
	l.held = on
	l.cond.Broadcast()
	l.mu.Unlock()
}

func (l *Held) pump() {
	defer close(l.done)
	for {
		l.mu.Lock()
		for !l.closed && (l.held || len(l.queue) == 0) {
			l.cond.Wait()
		}
		if l.closed {
			l.mu.Unlock()
			return
		}
		q := l.queue
		l.queue = nil
		l.mu.Unlock()
		for _, b := range q {
			if _, err := l.Conn.Write(b); err != nil {
				return
			}
		}
	}
}

// Close closes the connection and waits for the pump.
func (l *Held) Close() error {
	l.mu.Lock()
	l.closed = true
	l.cond.Broadcast()
	l.mu.Unlock()
	err := l.Conn.Close()
	<-l.done
	return err
}
