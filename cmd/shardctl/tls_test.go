package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/telemetry"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
)

// TestTokenNeverInTheClear: shardctl sends the admin token to an announced
// admin port over TLS, verified against --admin-ca-file, and never in the
// clear: a member announced (by whoever can write etcd) at a plain address
// off this host gets no request, and is named as not asked.
func TestTokenNeverInTheClear(t *testing.T) {
	etcd, etcdCli := testutil.Etcd(t)
	ctx := testutil.Context(t)
	const token = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}

	// A pusher's admin port over TLS.
	ca := testutil.NewCA(t)
	cert, key := ca.Issue(t, "pusher")
	tc, err := identity.ServerTLS(cert, key, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	secure, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tc.NextProtos = []string{"h2", "http/1.1"}
	admin := &telemetry.Admin{Listener: plain, TLSListener: secure, TLS: tc, DebugToken: telemetry.StaticToken(token),
		Ready: telemetry.NewReadiness(), Gatherer: telemetry.NewRegistry(),
		Debug: map[string]http.Handler{"/debug/syncz": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "[]") })}}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- admin.Run(actx) }()
	defer func() { cancel(); <-done }()

	// A member announced off this host without TLS, listening for tokens.
	var mu sync.Mutex
	var seen []string
	evil, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no second loopback address here: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		_, _ = io.WriteString(w, "[]")
	})}
	go func() { _ = srv.Serve(evil) }()
	defer srv.Close()

	for key, m := range map[string]store.Member{
		"pusher/good": {Role: "pusher", Name: "pusher-good", Admin: plain.Addr().String(), AdminTLS: secure.Addr().String()},
		"pusher/evil": {Role: "pusher", Name: "pusher-evil", Admin: evil.Addr().String()},
	} {
		v, _ := json.Marshal(m)
		if _, err := etcdCli.Put(ctx, store.MemberPrefix+key, string(v)); err != nil {
			t.Fatal(err)
		}
	}
	_, errOut, err := shardctl(etcd.Endpoint, "proxy-status", "--admin-token-file", tokenFile, "--admin-ca-file", ca.CertFile)
	if err == nil || !strings.Contains(err.Error(), "1 of 2 could not be asked") ||
		!strings.Contains(errOut, "pusher-evil") || !strings.Contains(errOut, "announced without TLS") || strings.Contains(errOut, "pusher-good") {
		t.Errorf("proxy-status: %v\n%s", err, errOut)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, h := range seen {
		if strings.Contains(h, token) {
			t.Fatal("the token was sent in the clear to an announced address")
		}
	}

	// Without the CA, the TLS port is not trusted: nothing is sent there.
	_, errOut, err = shardctl(etcd.Endpoint, "proxy-status", "--admin-token-file", tokenFile)
	if err == nil || !strings.Contains(errOut, "pusher-good") || !strings.Contains(errOut, "certificate") {
		t.Errorf("without --admin-ca-file: %v\n%s", err, errOut)
	}
}
