package pusher

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestGenCacheBoundedByBytes: past its bytes, the least recently used
// entries go, however few entries there are; a replaced entry's bytes are
// counted once.
func TestGenCacheBoundedByBytes(t *testing.T) {
	c, err := newGenCache(1000, 250, time.Minute, prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		c.add(fmt.Sprint("k", i), i, 100)
	}
	if c.len() != 2 || c.heldBytes() != 200 {
		t.Errorf("%d entries, %d bytes held; want 2 and 200", c.len(), c.heldBytes())
	}
	if _, ok := c.get("k4"); !ok {
		t.Error("the newest entry went")
	}
	c.add("k4", 4, 50)
	if c.heldBytes() != 150 {
		t.Errorf("after a replace, %d bytes held; want 150", c.heldBytes())
	}
}

// TestGenCacheForgetsIdleEntries: what no generation used for the idle
// time is forgotten by the next sweep (at most one a minute); what was
// used since stays.
func TestGenCacheForgetsIdleEntries(t *testing.T) {
	c, err := newGenCache(1000, 1<<30, 5*time.Minute, prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		c.add(fmt.Sprint("old", i), i, 1000)
	}
	c.add("used", 0, 1000)
	for i := range 10 {
		e, _ := c.lru.Peek(fmt.Sprint("old", i))
		e.used = e.used.Add(-6 * time.Minute) // last used six minutes ago
	}
	now := time.Now()
	c.sweep(now)
	if c.len() != 1 || c.heldBytes() != 1000 {
		t.Errorf("after a sweep, %d entries and %d bytes held; want the one used", c.len(), c.heldBytes())
	}
	c.add("later", 0, 1000)
	e, _ := c.lru.Peek("later")
	e.used = e.used.Add(-time.Hour)
	c.sweep(now.Add(30 * time.Second))
	if c.len() != 2 {
		t.Errorf("a second sweep within the minute ran: %d entries", c.len())
	}
}
