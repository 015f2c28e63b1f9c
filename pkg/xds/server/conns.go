package server

import (
	"net"
	"sync"
	"syscall"
	"time"
)

// conns are the server's client connections by remote address, so that a
// proxy placed elsewhere can be made to reconnect: ending its stream alone
// would have it open the next one on the same connection, to this server.
// The connections are kept as accepted (a wrapper would hide the
// *net.TCPConn that lets gRPC pool each idle connection's read buffer), so
// those gRPC has closed are found by asking their sockets, at most once a
// minute.
type conns struct {
	mu    sync.Mutex
	m     map[string]net.Conn
	swept time.Time
}

// listener records the connections it accepts.
type listener struct {
	net.Listener
	conns *conns
}

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cs := l.conns
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m == nil {
		cs.m = map[string]net.Conn{}
	}
	cs.m[c.RemoteAddr().String()] = c
	if now := time.Now(); now.Sub(cs.swept) > time.Minute {
		cs.swept = now
		for k, c := range cs.m {
			if closed(c) {
				delete(cs.m, k)
			}
		}
	}
	return c, nil
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
	cs.mu.Lock()
	c := cs.m[remote]
	delete(cs.m, remote)
	cs.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}
