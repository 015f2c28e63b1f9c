package bus

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/shardpilot/shardpilot/pkg/model"
)

// Workload registrations travel on core NATS subjects
// registry.v1.<namespace>, not in the stream: a registration lasts while
// its pusher repeats it, so there is nothing to replay. A pusher asks
// (request and reply) when a stream begins and waits for the answer, and
// asks again every heartbeat (a refusal then ends the stream); the
// ingester part owning the namespace answers; the disconnection is
// published without an answer.

// RegistryPrefix is the first part of the registration subjects.
const RegistryPrefix = "registry.v1"

// ErrRegistrationRefused says the ingesters refused a registration (no
// such WorkloadGroup, an identity the group does not admit); its message
// follows.
var ErrRegistrationRefused = errors.New("bus: registration refused")

// registrySubject is where a namespace's registrations go.
func registrySubject(namespace string) string { return RegistryPrefix + "." + namespace }

// answer is the reply to a connect: empty, or why it was refused.
type answer struct {
	Refused string `json:"refused,omitempty"`
}

// Announcer is the pushers' side: it tells the ingesters of the
// registered workloads whose streams it holds, repeats that every
// Heartbeat while they last, and of their end. Safe for concurrent use.
type Announcer struct {
	NATS *nats.Conn
	// Pusher names this pusher (the entries' workload controller).
	Pusher string
	// Heartbeat is how often the registrations are repeated. Default 10s.
	Heartbeat time.Duration
	// Timeout bounds the wait for an answer to a connect. Default 5s.
	Timeout time.Duration
	Log     *slog.Logger
	// Refused, when set, is told of a registration the ingesters refuse
	// on a repetition (its connect went unanswered, or its group changed):
	// the pusher ends its stream with the reason, as istiod refuses it.
	Refused func(key any, reason string)

	mu   sync.Mutex
	live map[any]model.Registration // by the stream's key
}

func (a *Announcer) heartbeat() time.Duration { return cmp.Or(a.Heartbeat, 10*time.Second) }

// Connect announces a stream's registration, under key (the stream's, for
// Disconnect), and waits for the answer: an error wrapping
// ErrRegistrationRefused when the ingesters refuse it. When none answers
// (no ingester leads the namespace, or the bus is down) the stream is
// kept and the registration is repeated until one does, as the pushers
// keep serving through the bus's outages.
func (a *Announcer) Connect(ctx context.Context, key any, r model.Registration) error {
	r.Op, r.Pusher, r.Heartbeat = model.RegistrationConnect, a.Pusher, a.heartbeat()
	if err := r.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrRegistrationRefused, err)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(a.Timeout, 5*time.Second))
	defer cancel()
	msg, err := a.NATS.RequestWithContext(ctx, registrySubject(r.Namespace), data)
	var ans answer
	if err == nil {
		err = json.Unmarshal(msg.Data, &ans)
	}
	if err == nil && ans.Refused != "" {
		return fmt.Errorf("%w: %s", ErrRegistrationRefused, ans.Refused)
	}
	if err != nil {
		a.Log.Warn("workload registration not answered: kept, and repeated until it is", "proxy", r.Proxy, "group", r.Namespace+"/"+r.Group, "err", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.live == nil {
		a.live = map[any]model.Registration{}
	}
	a.live[key] = r
	return nil
}

// Disconnect announces the end of a stream Connect registered.
func (a *Announcer) Disconnect(key any) {
	a.mu.Lock()
	r, ok := a.live[key]
	delete(a.live, key)
	a.mu.Unlock()
	if ok {
		r.Op = model.RegistrationDisconnect
		a.publish(r)
	}
}

// Registered returns how many streams are registered now.
func (a *Announcer) Registered() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.live)
}

func (a *Announcer) publish(r model.Registration) {
	data, err := json.Marshal(r)
	if err == nil {
		err = a.NATS.Publish(registrySubject(r.Namespace), data)
	}
	if err != nil {
		a.Log.Warn("workload registration not published", "op", r.Op, "proxy", r.Proxy, "err", err)
	}
}

// Run repeats the registrations every Heartbeat until ctx is done, each
// as a request: a refusal drops the registration and is handed to
// Refused; no answer changes nothing.
func (a *Announcer) Run(ctx context.Context) error {
	t := time.NewTicker(a.heartbeat())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		a.mu.Lock()
		keys := make([]any, 0, len(a.live))
		live := make([]model.Registration, 0, len(a.live))
		for k, r := range a.live {
			r.Op = model.RegistrationAlive
			keys, live = append(keys, k), append(live, r)
		}
		a.mu.Unlock()
		// Side by side, at most 16 at once, each waiting a heartbeat at most.
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for i, r := range live {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				a.repeat(ctx, keys[i], r)
			})
		}
		wg.Wait()
	}
}

// repeat announces a registration again and acts on a refusal.
func (a *Announcer) repeat(ctx context.Context, key any, r model.Registration) {
	data, err := json.Marshal(r)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, min(a.heartbeat(), cmp.Or(a.Timeout, 5*time.Second)))
	defer cancel()
	msg, err := a.NATS.RequestWithContext(ctx, registrySubject(r.Namespace), data)
	var ans answer
	if err != nil || json.Unmarshal(msg.Data, &ans) != nil || ans.Refused == "" {
		return
	}
	a.mu.Lock()
	cur, ok := a.live[key]
	if ok && cur.ConnectedAt.Equal(r.ConnectedAt) {
		delete(a.live, key)
	}
	a.mu.Unlock()
	a.Log.Warn("workload registration refused: its stream ends", "proxy", r.Proxy, "group", r.Namespace+"/"+r.Group, "reason", ans.Refused)
	if ok && a.Refused != nil {
		a.Refused(key, ans.Refused)
	}
}

// Registrations are the ingesters' side: Run hands every registration
// that arrives to handle, one at a time, and answers a connect with what
// handle returns; model.ErrNotMine leaves it to another part to answer.
type Registrations struct {
	NATS *nats.Conn
	Log  *slog.Logger
}

// Run subscribes until ctx is done. A message that does not decode or
// validate is logged and dropped (a connect is refused with the reason).
func (rs Registrations) Run(ctx context.Context, handle func(context.Context, model.Registration) error) error {
	msgs := make(chan *nats.Msg, 256)
	sub, err := rs.NATS.ChanSubscribe(RegistryPrefix+".*", msgs)
	if err != nil {
		return fmt.Errorf("bus: subscribe to registrations: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case msg := <-msgs:
			r, err := decodeRegistration(msg)
			if err == nil {
				err = handle(ctx, r)
			}
			if errors.Is(err, model.ErrNotMine) {
				continue
			}
			if err != nil {
				rs.Log.Warn("workload registration refused", "subject", msg.Subject, "op", r.Op, "proxy", r.Proxy, "err", err)
			}
			if msg.Reply == "" {
				continue
			}
			var ans answer
			if err != nil {
				ans.Refused = err.Error()
			}
			data, _ := json.Marshal(ans)
			if err := msg.Respond(data); err != nil {
				rs.Log.Warn("workload registration not answered", "proxy", r.Proxy, "err", err)
			}
		}
	}
}

// decodeRegistration reads a registration strictly and checks that it is
// on its namespace's subject.
func decodeRegistration(msg *nats.Msg) (model.Registration, error) {
	var r model.Registration
	dec := json.NewDecoder(bytes.NewReader(msg.Data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("bus: registration on %s: %w", msg.Subject, err)
	}
	if err := r.Validate(); err != nil {
		return r, fmt.Errorf("bus: %w", err)
	}
	if msg.Subject != registrySubject(r.Namespace) {
		return r, fmt.Errorf("bus: a registration for namespace %q on %s", r.Namespace, msg.Subject)
	}
	return r, nil
}
