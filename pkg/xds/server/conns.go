package server

import (
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// conns are the server's client connections by source address and
// remote address, so that a proxy placed elsewhere can be made to
// reconnect (ending its stream alone would have it open the next one on
// the same connection, to this server), and so that one source cannot
// open connections without end: past maxPerSource, a new connection from
// it is closed as it is accepted, before TLS or HTTP/2 cost anything. The
// connections are kept as accepted (a wrapper would hide the
// *net.TCPConn that lets gRPC pool each idle connection's read buffer),
// so those gRPC has closed are found by asking their sockets: a source's
// when it is at its limit, every one's at most once a minute.
type conns struct {
	// maxPerSource bounds the open connections of one source address (0:
	// unbounded); refused counts those closed for it.
	maxPerSource int
	refused      prometheus.Counter

	mu      *sync.Mutex                    // the server's books (Streams.mu)
	sources map[string]map[string]net.Conn // source → remote address → connection
	swept   time.Time
}

// listener records the connections it accepts.
type listener struct {
	net.Listener
	conns *conns
}

func (l listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.conns.add(c) {
			return c, nil
		}
		_ = c.Close()
	}
}

// add records an accepted connection, or reports false for one its
// source may not open.
func (cs *conns) add(c net.Conn) bool {
	remote := c.RemoteAddr().String()
	source := sourceOf(remote)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.sources == nil {
		cs.sources = map[string]map[string]net.Conn{}
	}
	if now := time.Now(); now.Sub(cs.swept) > time.Minute {
		cs.swept = now
		for s, m := range cs.sources {
			cs.sweepLocked(s, m)
		}
	}
	m := cs.sources[source]
	if cs.maxPerSource > 0 && len(m) >= cs.maxPerSource {
		if cs.sweepLocked(source, m); len(m) >= cs.maxPerSource {
			if cs.refused != nil {
				cs.refused.Inc()
			}
			return false
		}
	}
	if m == nil {
		m = map[string]net.Conn{}
		cs.sources[source] = m
	}
	m[remote] = c
	return true
}

// sweepLocked forgets a source's connections gRPC has closed.
func (cs *conns) sweepLocked(source string, m map[string]net.Conn) {
	for k, c := range m {
		if closed(c) {
			delete(m, k)
		}
	}
	if len(m) == 0 {
		delete(cs.sources, source)
	}
}

// sourceOf is the host of a remote address (the address itself when it
// has no port).
func sourceOf(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return host
	}
	return remote
}

// closed says whether a connection was closed (by gRPC, when it stopped
// serving it): its socket refuses to be used.
func closed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false // kept: the map holds as many as were accepted
	}
	raw, err := sc.SyscallConn()
	return err != nil || raw.Control(func(uintptr) {}) != nil
}

// close closes the connection from a remote address, if it is open.
func (cs *conns) close(remote string) {
	source := sourceOf(remote)
	cs.mu.Lock()
	m := cs.sources[source]
	c := m[remote]
	delete(m, remote)
	if len(m) == 0 {
		delete(cs.sources, source)
	}
	cs.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// held returns the connections kept of a source.
func (cs *conns) held(source string) int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(cs.sources[source])
}
