package sds

import (
	"context"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ca"
)

// TestRenewals: a held identity is due after two thirds of its
// certificate's life; one dropped with its last proxy is not renewed; a
// stream without an identity has no class.
func TestRenewals(t *testing.T) {
	test := testutil.NewCA(t)
	root, err := ca.FromFiles(test.CertFile, test.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{}); err == nil {
		t.Error("Secrets without a CA")
	}
	s, err := New(Config{CA: root, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Class(context.Background()); c != "" {
		t.Errorf("a stream without a peer has class %q", c)
	}
	const class = "spiffe://cluster.local/ns/demo/sa/app"
	if !s.AddClass(class, s.Fill) {
		t.Fatal("not added")
	}
	held := s.Resources(class, resource.SecretType)
	if len(held) != 2 || held[WorkloadSecret].(*tlsv3.Secret).GetTlsCertificate() == nil || held[RootSecret].(*tlsv3.Secret).GetValidationContext() == nil {
		t.Fatalf("held %v", held)
	}
	now := time.Now()
	if due := s.due(now.Add(30 * time.Minute)); len(due) != 0 {
		t.Errorf("due after half its life: %v", due)
	}
	if due := s.due(now.Add(41 * time.Minute)); len(due) != 1 || due[0] != class {
		t.Errorf("due past two thirds: %v", due)
	}
	s.RemoveClass(class)
	if due := s.due(now.Add(2 * time.Hour)); len(due) != 0 {
		t.Errorf("a dropped identity is due: %v", due)
	}
	// A class that is no identity is tried again, not served garbage.
	s.AddClass("envoy/demo/default", s.Fill)
	if due := s.due(time.Now().Add(time.Millisecond)); len(due) != 1 {
		t.Errorf("a failed issue is not retried: %v", due)
	}
}
