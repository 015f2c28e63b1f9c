package server

import (
	"net"
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
	cs := &conns{}
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
	if len(cs.m) != 0 {
		t.Errorf("%d connections kept after the close, want none", len(cs.m))
	}
}
