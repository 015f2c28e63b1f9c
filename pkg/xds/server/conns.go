package server

import (
	"net"
	"sync"
)

// conns are the server's client connections by remote address, so that a
// proxy placed elsewhere can be made to reconnect: ending its stream alone
// would have it open the next one on the same connection, to this server.
type conns struct {
	mu sync.Mutex
	m  map[string]net.Conn
}

// listener records the connections it accepts until they are closed.
type listener struct {
	net.Listener
	conns *conns
}

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.conns.mu.Lock()
	if l.conns.m == nil {
		l.conns.m = map[string]net.Conn{}
	}
	l.conns.m[c.RemoteAddr().String()] = c
	l.conns.mu.Unlock()
	return &conn{Conn: c, conns: l.conns}, nil
}

type conn struct {
	net.Conn
	conns *conns
	once  sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.conns.mu.Lock()
		if c.conns.m[c.RemoteAddr().String()] == c.Conn {
			delete(c.conns.m, c.RemoteAddr().String())
		}
		c.conns.mu.Unlock()
	})
	return c.Conn.Close()
}

// close closes the connection from a remote address, if it is open.
func (cs *conns) close(remote string) {
	cs.mu.Lock()
	c := cs.m[remote]
	cs.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}
