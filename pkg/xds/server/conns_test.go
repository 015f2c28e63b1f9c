package server

import (
	"net"
	"sync"
	"testing"
)

// TestConnsKeepsTheTCPConn: the listener hands gRPC the accepted
// *net.TCPConn itself (a wrapper would cost every idle connection its read
// buffer), finds it by its remote address, and tells a closed one apart.
func TestConnsKeepsTheTCPConn(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	cs := &conns{mu: new(sync.Mutex)}
	lis := listener{Listener: inner, conns: cs}
	client, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.(*net.TCPConn); !ok {
		t.Fatalf("Accept returned a %T, want the *net.TCPConn", c)
	}
	if closed(c) {
		t.Fatal("an open connection reads as closed")
	}
	cs.close(client.LocalAddr().String())
	if !closed(c) {
		t.Fatal("the connection of the remote address is still open")
	}
	if n := cs.held("127.0.0.1"); n != 0 {
		t.Errorf("%d connections kept after the close, want none", n)
	}
}

// TestConnectionsPerSourceAreBounded: past its limit, a source's new
// connection is closed as it is accepted; once one of its connections is
// closed, the next is taken again.
func TestConnectionsPerSourceAreBounded(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	cs := &conns{mu: new(sync.Mutex), maxPerSource: 3}
	lis := listener{Listener: inner, conns: cs}
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	var served []net.Conn
	for range 3 {
		dial()
		served = append(served, <-accepted)
	}
	// The fourth is closed by the server: the client reads EOF.
	refused := dial()
	if _, err := refused.Read(make([]byte, 1)); err == nil {
		t.Fatal("a fourth connection of one source was served")
	}
	// gRPC closes a connection it served: the source may open another.
	served[0].Close()
	dial()
	if c := <-accepted; c == nil {
		t.Fatal("no connection taken once one of the source's was closed")
	}
}
