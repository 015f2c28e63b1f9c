// Package h2flood is a client that holds a gRPC server's buffers: it
// opens streams to a method and sends each an unfinished message, speaking
// HTTP/2 itself so that it costs the process that runs it next to nothing.
// The tests and the load test's floods run it against the pushers. Its
// goroutines end when its connections are closed (Close).
package h2flood

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Flood is a client that opens streams to a gRPC method and sends each an
// unfinished message: a length prefix of size bytes and as much of the
// body as the server's flow control lets it, less one byte, so that a
// server that reads the message holds it for as long as the connection
// lasts. It speaks HTTP/2 itself, writing the same buffer over and over,
// so that it costs the process that runs it next to nothing.
type Flood struct {
	sent  atomic.Int64 // body bytes written
	reset atomic.Int64 // streams the server ended
	conns []net.Conn
	wg    sync.WaitGroup
}

// Start opens conns TLS connections (tc must offer ALPN h2) of streams
// streams each, each sending an unfinished message of size bytes.
func Start(addr string, tc *tls.Config, method string, conns, streams, size int) (*Flood, error) {
	f := &Flood{}
	for range conns {
		c, err := tls.Dial("tcp", addr, tc)
		if err != nil {
			f.Close()
			return nil, err
		}
		f.conns = append(f.conns, c)
		f.wg.Go(func() { f.run(c, addr, method, streams, size) })
	}
	return f, nil
}

// Close closes the connections and waits for the flood's goroutines.
func (f *Flood) Close() {
	for _, c := range f.conns {
		c.Close()
	}
	f.wg.Wait()
}

// Sent is the message bytes written; Reset the streams the server ended.
func (f *Flood) Sent() int64  { return f.sent.Load() }
func (f *Flood) Reset() int64 { return f.reset.Load() }

// floodConn is one connection's state: the send windows the server grants.
type floodConn struct {
	mu      sync.Mutex
	cond    *sync.Cond
	fr      *http2.Framer
	conn    int64
	streams map[uint32]int64
	initial int64
	closed  map[uint32]bool
}

func (f *Flood) run(c net.Conn, addr, method string, streams, size int) {
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		return
	}
	fc := &floodConn{fr: http2.NewFramer(c, c), conn: 65535, initial: 65535, streams: map[uint32]int64{}, closed: map[uint32]bool{}}
	fc.cond = sync.NewCond(&fc.mu)
	if fc.fr.WriteSettings() != nil {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { fc.read(f) })
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, h := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":path", method}, {":authority", addr},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
	}
	chunk := make([]byte, 16<<10)
	for i := range streams {
		id := uint32(2*i + 1)
		fc.mu.Lock()
		fc.streams[id] = fc.initial
		err := fc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr.Bytes(), EndHeaders: true})
		fc.mu.Unlock()
		if err != nil {
			return
		}
		wg.Go(func() {
			prefix := make([]byte, 5)
			binary.BigEndian.PutUint32(prefix[1:], uint32(size))
			left := size + 5 - 1 // never the last byte
			first := true
			for left > 0 {
				// The length prefix goes in a frame of its own.
				least := int64(1)
				if first {
					least = int64(len(prefix))
				}
				fc.mu.Lock()
				for !fc.closed[id] && (fc.conn < least || fc.streams[id] < least) {
					fc.cond.Wait()
				}
				if fc.closed[id] {
					fc.mu.Unlock()
					return
				}
				data := prefix
				if !first {
					data = chunk[:min(int64(min(left, len(chunk))), fc.conn, fc.streams[id])]
				}
				first = false
				n := int64(len(data))
				err := fc.fr.WriteData(id, false, data)
				fc.conn -= n
				fc.streams[id] -= n
				fc.mu.Unlock()
				if err != nil {
					return
				}
				left -= int(n)
				f.sent.Add(n)
			}
		})
	}
	wg.Wait()
}

// read follows the server's frames: settings, windows, stream ends.
func (fc *floodConn) read(f *Flood) {
	defer func() {
		fc.mu.Lock()
		for id := range fc.streams {
			fc.closed[id] = true
		}
		fc.cond.Broadcast()
		fc.mu.Unlock()
	}()
	for {
		fr, err := fc.fr.ReadFrame()
		if err != nil {
			return
		}
		fc.mu.Lock()
		switch fr := fr.(type) {
		case *http2.SettingsFrame:
			if !fr.IsAck() {
				if v, ok := fr.Value(http2.SettingInitialWindowSize); ok {
					for id := range fc.streams {
						fc.streams[id] += int64(v) - fc.initial
					}
					fc.initial = int64(v)
				}
				_ = fc.fr.WriteSettingsAck()
			}
		case *http2.WindowUpdateFrame:
			if fr.StreamID == 0 {
				fc.conn += int64(fr.Increment)
			} else {
				fc.streams[fr.StreamID] += int64(fr.Increment)
			}
		case *http2.RSTStreamFrame:
			fc.closed[fr.StreamID] = true
			f.reset.Add(1)
		case *http2.PingFrame:
			if !fr.IsAck() {
				_ = fc.fr.WritePing(true, fr.Data)
			}
		}
		fc.cond.Broadcast()
		fc.mu.Unlock()
	}
}

// Settle waits until the flood has sent what it can: no byte more for a
// second. It returns the bytes sent.
func (f *Flood) Settle() int64 {
	last := int64(-1)
	for n := f.sent.Load(); n != last; n = f.sent.Load() {
		last = n
		time.Sleep(time.Second)
	}
	return last
}
