package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/shardpilot/shardpilot/internal/embedded"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/model"
)

// registrationsSeen records what the ingesters' side was handed.
type registrationsSeen struct {
	mu  sync.Mutex
	ops []string
}

func (s *registrationsSeen) add(r model.Registration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ops = append(s.ops, string(r.Op)+" "+r.Group)
}

func (s *registrationsSeen) has(op string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.ops {
		if o == op {
			return true
		}
	}
	return false
}

// TestRegistrations: under the roles' permissions, a pusher (consumer)
// announces a workload and waits for the ingester's (relay's) answer, a
// refusal with its reason; repeats it while the stream lasts and
// announces its end. A registration no ingester answers is kept. A pusher
// cannot read registrations, and garbage on the subjects is refused
// without harm.
func TestRegistrations(t *testing.T) {
	ctx, cancel := context.WithCancel(testutil.Context(t))
	connect, seen, denied, stop := ingestersAnswering(t, ctx)
	defer func() { cancel(); stop() }()
	pusherNC := connect(bus.RoleConsumer)
	// The subscription is made: a request made before it would go
	// unanswered.
	testutil.Eventually(t, 10*time.Second, "the ingesters' side subscribed", func() (bool, string) {
		_, err := pusherNC.Request("registry.v1.payments", []byte("{}"), 200*time.Millisecond)
		return err == nil, fmt.Sprint(err)
	})
	refused := make(chan string, 4)
	a := &bus.Announcer{NATS: pusherNC, Pusher: "pusher-0", Heartbeat: 50 * time.Millisecond, Timeout: 300 * time.Millisecond, Log: testutil.Log(t)}
	announced := make(chan error, 1)
	go func() {
		announced <- a.Run(ctx, func(key any, reason string) { refused <- fmt.Sprint(key, ": ", reason) })
	}()
	defer func() { cancel(); <-announced }()
	reg := func(group string) model.Registration {
		return model.Registration{Group: group, Namespace: "payments", Identity: "spiffe://cluster.local/ns/payments/sa/vm",
			Proxy: "sidecar~10.0.0.7~vm.payments~payments.svc.cluster.local", Address: "10.0.0.7", ConnectedAt: time.Now()}
	}
	if err := a.Connect(ctx, "s1", reg("vms")); err != nil {
		t.Fatalf("a registration the ingesters accept: %v", err)
	}
	err := a.Connect(ctx, "s2", reg("missing"))
	if !errors.Is(err, bus.ErrRegistrationRefused) || !strings.Contains(err.Error(), "payments/missing not found") {
		t.Errorf("a registration of a missing group: %v, want refused with the reason", err)
	}
	if err := a.Connect(ctx, "s3", reg("elsewhere")); err != nil {
		t.Errorf("a registration no ingester answers: %v, want kept", err)
	}
	if got := a.Registered(); got != 2 {
		t.Errorf("%d registrations kept, want the accepted one and the unanswered one", got)
	}
	// Refused when repeated: its stream is to end.
	if err := a.Connect(ctx, "s5", reg("late")); err != nil {
		t.Errorf("a registration no ingester answers at first: %v, want kept", err)
	}
	select {
	case got := <-refused:
		if got != "s5: identity not admitted by WorkloadGroup payments/late" {
			t.Errorf("refused when repeated: %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Error("a registration refused when repeated was not handed over")
	}
	testutil.Eventually(t, 10*time.Second, "the registrations are repeated", func() (bool, string) {
		return seen.has("alive vms") && seen.has("alive elsewhere"), ""
	})
	a.Disconnect("s1")
	testutil.Eventually(t, 10*time.Second, "the end of the stream is announced", func() (bool, string) {
		return seen.has("disconnect vms"), ""
	})
	bad := reg("vms")
	bad.Address = "not-an-ip"
	if err := a.Connect(ctx, "s4", bad); !errors.Is(err, bus.ErrRegistrationRefused) {
		t.Errorf("a registration without an address: %v, want refused", err)
	}

	refusesGarbage(t, pusherNC)
	cannotEavesdrop(t, pusherNC, denied)
}

// ingestersAnswering runs a NATS server with the roles' users and the
// ingesters' side (the relay's role) answering registrations: group
// "missing" is refused, "elsewhere" left to another part, "late" left
// unanswered at first and refused when repeated. It returns how to
// connect as a role, what the ingesters were handed, the permission
// errors of the connections, and a function that waits for its end once
// ctx is done.
func ingestersAnswering(t *testing.T, ctx context.Context) (func(bus.Role) *nats.Conn, *registrationsSeen, chan error, func()) {
	t.Helper()
	n := startRoleNATS(t)
	denied := make(chan error, 4)
	connect := func(role bus.Role) *nats.Conn {
		nc, err := nats.Connect(n.URL, nats.UserInfo(string(role), string(role)+"-secret"),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				select {
				case denied <- err:
				default:
				}
			}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	log := testutil.Log(t)
	seen := &registrationsSeen{}
	done := make(chan error, 1)
	go func() {
		done <- (&bus.Registrations{NATS: connect(bus.RoleRelay), Log: log}).Run(ctx, func(_ context.Context, r model.Registration) error {
			seen.add(r)
			switch r.Group {
			case "missing":
				return errors.New("WorkloadGroup payments/missing not found")
			case "elsewhere":
				return model.ErrNotMine
			case "late":
				// Unanswered at first, refused when repeated.
				if r.Op == model.RegistrationConnect {
					return model.ErrNotMine
				}
				return errors.New("identity not admitted by WorkloadGroup payments/late")
			}
			return nil
		})
	}()
	return connect, seen, denied, func() { <-done }
}

// refusesGarbage: garbage, and a registration on another namespace's
// subject, are refused with the reason.
func refusesGarbage(t *testing.T, pusherNC *nats.Conn) {
	t.Helper()
	for subject, data := range map[string]string{
		"registry.v1.payments": "{not json",
		"registry.v1.shop":     `{"op":"connect","group":"vms","namespace":"payments","identity":"x","proxy":"p","address":"10.0.0.7","connectedAt":"2026-01-01T00:00:00Z","pusher":"p","heartbeat":1000000000}`,
	} {
		msg, err := pusherNC.Request(subject, []byte(data), 2*time.Second)
		if err != nil || !strings.Contains(string(msg.Data), "refused") {
			t.Errorf("%s on %s: answered %v (%v), want refused", data, subject, msg, err)
		}
	}
}

// cannotEavesdrop: a pusher cannot read what the others announce.
func cannotEavesdrop(t *testing.T, pusherNC *nats.Conn, denied chan error) {
	t.Helper()
	if _, err := pusherNC.Subscribe("registry.v1.*", func(*nats.Msg) {}); err == nil {
		select {
		case err := <-denied:
			if !strings.Contains(err.Error(), "Permissions Violation") {
				t.Errorf("a pusher subscribing to registrations: %v, want a permissions violation", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("a pusher subscribed to the registrations")
		}
	}
}

// TestRegistrationsLost: registrations NATS drops while the ingesters'
// side falls behind are counted, so that the registrar knows a heartbeat
// may be among them.
func TestRegistrationsLost(t *testing.T) {
	_, nc := testutil.NATS(t)
	rs := &bus.Registrations{NATS: nc, Log: testutil.Log(t)}
	ctx, cancel := context.WithCancel(testutil.Context(t))
	held, first := make(chan struct{}), make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- rs.Run(ctx, func(ctx context.Context, _ model.Registration) error {
			select {
			case first <- struct{}{}:
			default:
			}
			select {
			case <-held:
			case <-ctx.Done():
			}
			return nil
		})
	}()
	defer func() { cancel(); <-done }()
	pub, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	reg := fmt.Sprintf(`{"op":"alive","group":"vms","namespace":"payments","identity":"spiffe://cluster.local/ns/payments/sa/vm","proxy":"p","address":"10.0.0.7","connectedAt":%q,"pusher":"p","heartbeat":1000000000}`,
		time.Now().UTC().Format(time.RFC3339))
	testutil.Eventually(t, 10*time.Second, "the ingesters' side is handed a registration", func() (bool, string) {
		_ = pub.Publish("registry.v1.payments", []byte(reg))
		_ = pub.Flush()
		select {
		case <-first:
			return true, ""
		case <-time.After(100 * time.Millisecond):
			return false, "nothing handed over"
		}
	})
	if rs.Lost() != 0 {
		t.Fatalf("%d lost before any flood", rs.Lost())
	}
	for range 10_000 {
		if err := pub.Publish("registry.v1.payments", []byte(reg)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the registrations dropped are counted", func() (bool, string) {
		return rs.Lost() > 0, "none counted"
	})
	close(held)
}

// TestStreamDeliveredToRegistrationsIsDropped: NATS's permissions cannot
// stop a pusher's credential making a push consumer of the change stream
// that delivers to registry.v1.<namespace>. Such a consumer delivers once
// any subscription names its subject exactly (an operator watching it, a
// gateway's optimistic interest), and then to every subscription its
// subject matches: the ingesters' registry.v1.* among them. The
// ingesters' side drops its messages (their reply is the consumer's
// $JS.ACK subject, which no client may use, or they are its flow control
// and heartbeats) before they are buffered or read as registrations,
// counts them, and answers a real registration meanwhile. Before, each
// was decoded, refused with a warning and answered, in the buffer the
// registrations wait in.
func TestStreamDeliveredToRegistrationsIsDropped(t *testing.T) {
	var users []*natsserver.User
	for _, role := range []bus.Role{bus.RoleRelay, bus.RoleConsumer} {
		u, err := embedded.RoleUser(string(role), string(role)+"-secret", role)
		if err != nil {
			t.Fatal(err)
		}
		users = append(users, u)
	}
	// An operator watching the subjects.
	users = append(users, &natsserver.User{Username: "operator", Password: "operator-secret"})
	n, err := embedded.StartNATSWith(t.TempDir(), 0, embedded.NATSOptions{Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	ctx, cancel := context.WithCancel(testutil.Context(t))
	connect := func(role bus.Role) *nats.Conn {
		nc, err := nats.Connect(n.URL, nats.UserInfo(string(role), string(role)+"-secret"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	relay, err := ensured(ctx, connect(bus.RoleRelay), bus.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const events = 2000
	for rev := range int64(events) {
		if _, err := relay.Publish(ctx, put(rev+1)); err != nil {
			t.Fatal(err)
		}
	}
	var handed atomic.Int64
	rs := &bus.Registrations{NATS: connect(bus.RoleRelay), Log: testutil.Log(t)}
	done := make(chan error, 1)
	go func() {
		done <- rs.Run(ctx, func(context.Context, model.Registration) error { handed.Add(1); return nil })
	}()
	defer func() { cancel(); <-done }()
	pusherNC := connect(bus.RoleConsumer)
	testutil.Eventually(t, 10*time.Second, "the ingesters' side subscribed", func() (bool, string) {
		_, err := pusherNC.Request("registry.v1.payments", []byte("{}"), 200*time.Millisecond)
		return err == nil, fmt.Sprint(err)
	})

	// The pusher's credential makes the consumer: NATS lets it.
	req := `{"stream_name":"SHARDPILOT_MESH","config":{"durable_name":"redirect","deliver_subject":"registry.v1.payments","deliver_policy":"all","ack_policy":"none","flow_control":true,"idle_heartbeat":100000000}}`
	msg, err := pusherNC.Request("$JS.API.CONSUMER.CREATE.SHARDPILOT_MESH.redirect", []byte(req), 5*time.Second)
	if err != nil || strings.Contains(string(msg.Data), `"error"`) {
		t.Fatalf("the pusher's credential makes a push consumer: %v %s", err, msg.Data)
	}

	// Anyone subscribing to that subject by name (an operator's
	// "nats sub registry.v1.payments", or a gateway's optimistic
	// interest) makes it deliver the stream, to the ingesters too.
	watch, err := connect("operator").SubscribeSync("registry.v1.payments")
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Unsubscribe()
	testutil.Eventually(t, 30*time.Second, "every delivered event dropped", func() (bool, string) {
		return rs.Ignored() >= events, fmt.Sprintf("%d of %d dropped", rs.Ignored(), events)
	})
	if h := handed.Load(); h != 0 {
		t.Errorf("%d delivered events were handed over as registrations", h)
	}
	if lost := rs.Lost(); lost != 0 {
		t.Errorf("%d registrations lost while the stream was delivered", lost)
	}
	// A real registration is answered meanwhile.
	a := &bus.Announcer{NATS: pusherNC, Pusher: "pusher-0", Heartbeat: time.Minute, Timeout: 5 * time.Second, Log: testutil.Log(t)}
	announced := make(chan error, 1)
	go func() { announced <- a.Run(ctx, nil) }()
	defer func() { cancel(); <-announced }()
	if err := a.Connect(ctx, "s1", model.Registration{Group: "vms", Namespace: "payments", Identity: "spiffe://cluster.local/ns/payments/sa/vm",
		Proxy: "sidecar~10.0.0.7~vm.payments~payments.svc.cluster.local", Address: "10.0.0.7", ConnectedAt: time.Now()}); err != nil {
		t.Errorf("a registration while the stream is delivered to its subject: %v", err)
	}
	if handed.Load() != 1 {
		t.Errorf("%d registrations handed over, want the one", handed.Load())
	}

}
