package model

import (
	"strings"
	"testing"
	"time"
)

// TestRegistrationBounds: what a pusher's NATS credential announces is
// bounded: a heartbeat of years (an entry kept alive for three of them
// after its messages stop) is refused, one of minutes taken.
func TestRegistrationBounds(t *testing.T) {
	r := Registration{Op: RegistrationConnect, Group: "vms", Namespace: "shop", Identity: "spiffe://cluster.local/ns/shop/sa/vm",
		Proxy: "sidecar~10.0.0.7~vm.shop~shop.svc.cluster.local", Address: "10.0.0.7", ConnectedAt: time.Now(), Pusher: "pusher-0",
		Heartbeat: MaxRegistrationHeartbeat}
	if err := r.Validate(); err != nil {
		t.Errorf("the longest heartbeat: %v", err)
	}
	r.Heartbeat = 90 * 365 * 24 * time.Hour
	if err := r.Validate(); err == nil || !strings.Contains(err.Error(), "heartbeat") {
		t.Errorf("a heartbeat of 90 years: %v, want refused", err)
	}
}
