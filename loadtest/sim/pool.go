package sim

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// dirtyPool is the simulated proxies' gRPC buffer pool: buffers in
// power-of-two sizes, handed out without clearing. gRPC's default pool
// clears a whole 1 MiB buffer for each message above 32 KiB (a route
// configuration of a thousand hosts), which made clearing memory the load
// test's largest cost; its own readers overwrite what they read, so stale
// bytes are never seen.
type dirtyPool struct {
	tiers [33]sync.Pool // by the exponent of the size
}

var _ mem.BufferPool = (*dirtyPool)(nil)

func tier(n int) int {
	if n <= 1 {
		return 0
	}
	return bits.Len(uint(n - 1))
}

func (p *dirtyPool) Get(length int) *[]byte {
	t := tier(length)
	if t >= len(p.tiers) {
		b := make([]byte, length)
		return &b
	}
	if b, ok := p.tiers[t].Get().(*[]byte); ok {
		*b = (*b)[:length]
		return b
	}
	b := make([]byte, length, 1<<t)
	return &b
}

func (p *dirtyPool) Put(b *[]byte) {
	c := cap(*b)
	t := tier(c)
	if t >= len(p.tiers) || c != 1<<t {
		return // not one of ours
	}
	p.tiers[t].Put(b)
}
