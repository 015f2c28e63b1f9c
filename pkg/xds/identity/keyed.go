package identity

import (
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
)

// KeyedLimit gives each key (an identity, a peer address) a burst, then
// one every interval; the most recently seen keys are remembered, one
// forgotten starts again with a full burst. Safe for concurrent use.
type KeyedLimit[K comparable] struct {
	every time.Duration
	burst int
	keys  *lru.Cache[K, *rate.Limiter]
}

// NewKeyedLimit remembers up to held keys.
func NewKeyedLimit[K comparable](every time.Duration, burst, held int) *KeyedLimit[K] {
	keys, _ := lru.New[K, *rate.Limiter](held)
	return &KeyedLimit[K]{every: every, burst: burst, keys: keys}
}

// Allow takes one from key's allowance.
func (k *KeyedLimit[K]) Allow(key K) bool {
	l := rate.NewLimiter(rate.Every(k.every), k.burst)
	if known, ok, _ := k.keys.PeekOrAdd(key, l); ok {
		l = known
	}
	return l.Allow()
}
