package bus_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/shardpilot/shardpilot/internal/embedded"
	"github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/model"
	"google.golang.org/protobuf/proto"
)

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// rawPublish writes a message into the stream as a bus credential alone
// could: any subject, any headers.
func rawPublish(t *testing.T, nc *nats.Conn, subject string, ev *meshv1.ChangeEvent, header nats.Header) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	data, err := proto.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(testutil.Context(t), &nats.Msg{Subject: subject, Data: data, Header: header}); err != nil {
		t.Fatal(err)
	}
}

// consumeOne returns the first event a consumer takes from sequence 1, or
// its error.
func consumeOne(ctx context.Context, b *bus.Bus) (*meshv1.ChangeEvent, error) {
	var got *meshv1.ChangeEvent
	stop := errors.New("stop")
	err := b.Consume(ctx, 1, func(_ uint64, ev *meshv1.ChangeEvent) error {
		got = ev
		return stop
	})
	if errors.Is(err, stop) {
		return got, nil
	}
	return nil, err
}

// TestConsumeRefusesForeignEvents: a consumer takes only events the relay
// can have published: on the subject their key maps to and, when it
// verifies, signed with the relay's key.
func TestConsumeRefusesForeignEvents(t *testing.T) {
	relayKey, otherKey := newKey(t), newKey(t)
	ev := &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Key: "/mesh/v1/endpoints/payments/api/k8s", Revision: 7, Count: 1}
	for name, tc := range map[string]struct {
		publisher, consumer bus.Config
		// raw, when set, writes the event on this subject, unsigned.
		raw     string
		refused bool
	}{
		"the relay's event, unverified":         {},
		"the relay's signed event, verified":    {publisher: bus.Config{Sign: relayKey}, consumer: bus.Config{Verify: []ed25519.PublicKey{relayKey.Public().(ed25519.PublicKey)}}},
		"an unsigned event, verified":           {consumer: bus.Config{Verify: []ed25519.PublicKey{relayKey.Public().(ed25519.PublicKey)}}, refused: true},
		"an event signed by another key":        {publisher: bus.Config{Sign: otherKey}, consumer: bus.Config{Verify: []ed25519.PublicKey{relayKey.Public().(ed25519.PublicKey)}}, refused: true},
		"the new key while it is rotated":       {publisher: bus.Config{Sign: otherKey}, consumer: bus.Config{Verify: []ed25519.PublicKey{relayKey.Public().(ed25519.PublicKey), otherKey.Public().(ed25519.PublicKey)}}},
		"another namespace's subject":           {raw: "mesh.v1.endpoints.shop", refused: true},
		"another kind's subject":                {raw: "mesh.v1.services.payments", refused: true},
		"the key's subject, raw and unverified": {raw: "mesh.v1.endpoints.payments"},
	} {
		t.Run(name, func(t *testing.T) {
			_, nc := testutil.NATS(t)
			ctx := testutil.Context(t)
			pub, err := ensured(ctx, nc, tc.publisher)
			if err != nil {
				t.Fatal(err)
			}
			if tc.raw != "" {
				rawPublish(t, nc, tc.raw, ev, nil)
			} else if _, err := pub.Publish(ctx, ev); err != nil {
				t.Fatal(err)
			}
			cons, err := bus.New(nc, tc.consumer)
			if err != nil {
				t.Fatal(err)
			}
			got, err := consumeOne(ctx, cons)
			_, _, lastErr := cons.Last(ctx)
			if tc.refused {
				if !errors.Is(err, model.ErrRefused) || got != nil {
					t.Fatalf("consumed %v (%v), want model.ErrRefused", got, err)
				}
				if !errors.Is(lastErr, model.ErrRefused) {
					t.Fatalf("last: %v, want model.ErrRefused", lastErr)
				}
				return
			}
			if err != nil || !proto.Equal(got, ev) || lastErr != nil {
				t.Fatalf("consumed %v (%v; last: %v), want %v", got, err, lastErr, ev)
			}
		})
	}
}

// TestCheckFindsAnAlteredStream: a stream that captures another subject, or
// is gone, fails Check until the relay's Ensure makes it as it was; an
// event published on the captured subject is refused.
func TestCheckFindsAnAlteredStream(t *testing.T) {
	_, nc := testutil.NATS(t)
	ctx := testutil.Context(t)
	b, err := ensured(ctx, nc, bus.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Check(ctx); err != nil {
		t.Fatalf("check after ensure: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "SHARDPILOT_MESH")
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Subjects = append(cfg.Subjects, "evil.>")
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(ctx); !errors.Is(err, bus.ErrAltered) {
		t.Fatalf("check of a widened stream: %v, want bus.ErrAltered", err)
	}
	rawPublish(t, nc, "evil.x", &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Key: "/mesh/v1/services/payments/api", Revision: 3, Count: 1}, nil)
	if got, err := consumeOne(ctx, b); !errors.Is(err, model.ErrRefused) {
		t.Fatalf("consumed %v (%v) from evil.x, want model.ErrRefused", got, err)
	}
	if err := b.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(ctx); err != nil {
		t.Fatalf("check after the relay's ensure: %v", err)
	}
	if err := js.DeleteStream(ctx, "SHARDPILOT_MESH"); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(ctx); !errors.Is(err, bus.ErrAltered) {
		t.Fatalf("check of a deleted stream: %v, want bus.ErrAltered", err)
	}
	if err := b.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(ctx); err != nil {
		t.Fatalf("check after the relay made the stream again: %v", err)
	}
}

// startRoleNATS starts a NATS server whose users are the roles, each
// named as its role with the password "<role>-secret".
func startRoleNATS(t *testing.T) *embedded.NATS {
	t.Helper()
	user := func(role bus.Role) *natsserver.User {
		u, err := embedded.RoleUser(string(role), string(role)+"-secret", role)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	n, err := embedded.StartNATSWith(t.TempDir(), 0, embedded.NATSOptions{Users: []*natsserver.User{user(bus.RoleRelay), user(bus.RoleConsumer)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

// TestRolePermissions runs a NATS server whose users hold RolePermissions:
// the relay makes the stream and publishes, the consumer reads it, and
// neither can delete, purge or widen it; the consumer can publish nothing.
func TestRolePermissions(t *testing.T) {
	n := startRoleNATS(t)
	ctx := testutil.Context(t)
	connect := func(role bus.Role) (*nats.Conn, jetstream.JetStream) {
		nc, err := nats.Connect(n.URL, nats.UserInfo(string(role), string(role)+"-secret"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return nc, js
	}
	relayNC, relayJS := connect(bus.RoleRelay)
	relay, err := ensured(ctx, relayNC, bus.Config{})
	if err != nil {
		t.Fatalf("the relay makes the stream: %v", err)
	}
	for rev := range int64(3) {
		if _, err := relay.Publish(ctx, put(rev+1)); err != nil {
			t.Fatalf("the relay publishes: %v", err)
		}
	}
	if last, _, err := relay.Last(ctx); err != nil || last.Revision != 3 {
		t.Fatalf("the relay reads its last event: %v (%v)", last, err)
	}

	consNC, consJS := connect(bus.RoleConsumer)
	cons, err := bus.New(consNC, bus.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if seq, err := cons.LastSeq(ctx); err != nil || seq != 3 {
		t.Fatalf("the consumer reads the stream's position: %d (%v)", seq, err)
	}
	if got, err := consumeOne(ctx, cons); err != nil || got.Revision != 1 {
		t.Fatalf("the consumer consumes: %v (%v)", got, err)
	}
	if err := cons.ConsumeSubjects(ctx, 1, bus.ScopeSubjects([]string{"ns"}), func(seq uint64, _ *meshv1.ChangeEvent) error {
		if seq == 3 {
			return errStop
		}
		return nil
	}); !errors.Is(err, errStop) {
		t.Fatalf("the consumer consumes some subjects: %v", err)
	}

	all := forbidden(ctx, relayJS, consJS, cons)
	var wg sync.WaitGroup
	for _, a := range all {
		wg.Go(func() {
			if err := timed(ctx, a.do); err == nil {
				t.Errorf("%s: allowed", a.what)
			}
		})
	}
	wg.Wait()
	s, err := relayJS.Stream(ctx, "SHARDPILOT_MESH")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 || !slices.Equal(info.Config.Subjects, []string{bus.SubjectPrefix + ".>"}) {
		t.Errorf("the stream holds %d messages on %v after the attempts, want 3 on mesh.v1.>", info.State.Msgs, info.Config.Subjects)
	}
}

// attempt is something a role may not do.
type attempt struct {
	what string
	do   func(context.Context) error
}

// forbidden is what neither the relay nor the consumer may do, and what
// the consumer may not do either.
func forbidden(ctx context.Context, relayJS, consJS jetstream.JetStream, cons *bus.Bus) []attempt {
	widened := func(js jetstream.JetStream) error {
		_, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "SHARDPILOT_MESH", Subjects: []string{bus.SubjectPrefix + ".>", "evil.>"}, Storage: jetstream.FileStorage})
		return err
	}
	attempts := map[string]func(jetstream.JetStream) error{
		"delete the stream": func(js jetstream.JetStream) error { return js.DeleteStream(ctx, "SHARDPILOT_MESH") },
		"purge the stream": func(js jetstream.JetStream) error {
			s, err := js.Stream(ctx, "SHARDPILOT_MESH")
			if err != nil {
				return err
			}
			return s.Purge(ctx)
		},
		"delete a message": func(js jetstream.JetStream) error {
			s, err := js.Stream(ctx, "SHARDPILOT_MESH")
			if err != nil {
				return err
			}
			return s.DeleteMsg(ctx, 2)
		},
		"make another stream on the mesh subjects": func(js jetstream.JetStream) error {
			_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SHADOW", Subjects: []string{"evil.>"}})
			return err
		},
	}
	// A refused request is never answered: the attempts wait for their
	// time-outs side by side.
	var all []attempt
	for what, do := range attempts {
		for role, js := range map[bus.Role]jetstream.JetStream{bus.RoleRelay: relayJS, bus.RoleConsumer: consJS} {
			all = append(all, attempt{string(role) + ": " + what, func(context.Context) error { return do(js) }})
		}
	}
	all = append(all, attempt{"consumer: widen the stream", func(context.Context) error { return widened(consJS) }},
		attempt{"consumer: make or update the stream", cons.Ensure})
	for _, subject := range []string{bus.SubjectPrefix + ".endpoints.payments", "evil.x"} {
		all = append(all, attempt{"consumer: publish on " + subject, func(ctx context.Context) error {
			_, err := consJS.Publish(ctx, subject, []byte("forged"))
			return err
		}})
	}
	return all
}

var errStop = errors.New("stop")

// timed runs a call that a permission violation makes wait for its
// answer until it times out.
func timed(ctx context.Context, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return fn(ctx)
}

// TestServerConfig: the documented nats-server users name every subject.
func TestServerConfig(t *testing.T) {
	p, err := bus.RolePermissions(bus.RoleConsumer, "MESH")
	if err != nil {
		t.Fatal(err)
	}
	conf := p.ServerConfig("shardpilot-pusher", "PUSHER_PASSWORD")
	for _, s := range append(p.Publish, p.Subscribe...) {
		if !strings.Contains(conf, `"`+s+`"`) {
			t.Errorf("%s missing from\n%s", s, conf)
		}
	}
	if _, err := bus.RolePermissions("admin", ""); err == nil {
		t.Error("an unknown role has permissions")
	}
	if _, err := bus.RolePermissions(bus.RoleRelay, "a.b"); err == nil {
		t.Error("a stream name with a dot was taken")
	}
}
