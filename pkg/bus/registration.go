package bus

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	refused, err := a.ask(ctx, r, cmp.Or(a.Timeout, 5*time.Second))
	if refused != "" {
		return fmt.Errorf("%w: %s", ErrRegistrationRefused, refused)
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
// as a request whose answer comes back to one inbox of its own, so that
// none waits on another: a refusal drops the registration and is handed
// to refused (nil: none), which ends the stream of key with the reason,
// as istiod refuses it (its connect went unanswered, or its group
// changed); no answer by the next heartbeat changes nothing.
func (a *Announcer) Run(ctx context.Context, refused func(key any, reason string)) error {
	inbox := a.NATS.NewRespInbox()
	answers := make(chan *nats.Msg, 256)
	sub, err := a.NATS.ChanSubscribe(inbox+".*", answers)
	if err != nil {
		return fmt.Errorf("bus: subscribe to registration answers: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	t := time.NewTicker(a.heartbeat())
	defer t.Stop()
	type asked struct {
		key any
		r   model.Registration
	}
	var pending map[string]asked // this round's, by the token ending their reply subject
	for seq := 0; ; {
		select {
		case <-ctx.Done():
			return nil
		case msg := <-answers:
			token := msg.Subject[strings.LastIndexByte(msg.Subject, '.')+1:]
			q, ok := pending[token]
			var ans answer
			if ok && json.Unmarshal(msg.Data, &ans) == nil && ans.Refused != "" {
				a.refused(q.key, q.r, ans.Refused, refused)
			}
		case <-t.C:
			a.mu.Lock()
			pending = make(map[string]asked, len(a.live))
			for k, r := range a.live {
				seq++
				r.Op = model.RegistrationAlive
				pending[strconv.Itoa(seq)] = asked{k, r}
			}
			a.mu.Unlock()
			for token, q := range pending {
				data, err := json.Marshal(q.r)
				if err == nil {
					err = a.NATS.PublishRequest(registrySubject(q.r.Namespace), inbox+"."+token, data)
				}
				if err != nil {
					a.Log.Warn("workload registration not repeated", "proxy", q.r.Proxy, "err", err)
				}
			}
		}
	}
}

// refused drops a registration the ingesters refused on a repetition, if
// it is still the stream's, and hands it to tell.
func (a *Announcer) refused(key any, r model.Registration, reason string, tell func(key any, reason string)) {
	a.mu.Lock()
	cur, ok := a.live[key]
	ok = ok && cur.ConnectedAt.Equal(r.ConnectedAt)
	if ok {
		delete(a.live, key)
	}
	a.mu.Unlock()
	if !ok {
		return
	}
	a.Log.Warn("workload registration refused: its stream ends", "proxy", r.Proxy, "group", r.Namespace+"/"+r.Group, "reason", reason)
	if tell != nil {
		tell(key, reason)
	}
}

// ask announces a registration and waits up to timeout for the answer:
// why it was refused, "" when it was accepted, or the error of a request
// nobody answered.
func (a *Announcer) ask(ctx context.Context, r model.Registration, timeout time.Duration) (refused string, err error) {
	data, err := json.Marshal(r)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg, err := a.NATS.RequestWithContext(ctx, registrySubject(r.Namespace), data)
	if err != nil {
		return "", err
	}
	var ans answer
	if err := json.Unmarshal(msg.Data, &ans); err != nil {
		return "", fmt.Errorf("bus: registration answer: %w", err)
	}
	return ans.Refused, nil
}

// Registrations are the ingesters' side: Run hands every registration
// that arrives to handle, one at a time, and answers a connect with what
// handle returns; model.ErrNotMine leaves it to another part to answer.
type Registrations struct {
	NATS *nats.Conn
	Log  *slog.Logger

	sub     atomic.Pointer[nats.Subscription]
	lost    atomic.Uint64
	full    atomic.Uint64 // dropped by Run's subscription: its buffer was full
	ignored atomic.Uint64
	warned  atomic.Int64 // unix nanoseconds of the last warning of ignored messages
}

// Ignored counts the messages on the registration subjects that a stream
// consumer delivered (see jetStreamDelivery), dropped before they were
// read.
func (rs *Registrations) Ignored() uint64 { return rs.ignored.Load() }

// Lost counts the registrations NATS dropped before Run read them (it
// fell behind), as NATS counts them now: a handler that is slow to answer
// does not hold the count back.
func (rs *Registrations) Lost() uint64 {
	if sub := rs.sub.Load(); sub != nil {
		if n, err := sub.Dropped(); err == nil {
			for last := rs.lost.Load(); uint64(n) > last && !rs.lost.CompareAndSwap(last, uint64(n)); last = rs.lost.Load() {
			}
		}
	}
	return rs.lost.Load() + rs.full.Load()
}

// jetStreamDelivery tells a message a stream consumer delivered, or its
// flow control or heartbeat, from a registration a pusher sent. NATS's
// permissions name the subjects a user may publish to, not the subject a
// consumer it makes delivers to: a pusher's credential may make a push
// consumer of the change stream that delivers to registry.v1.*. Such
// messages are dropped before they are buffered, so that a stream
// delivered there at the server's speed neither fills the buffer the
// registrations wait in nor is read as a registration.
func jetStreamDelivery(msg *nats.Msg) bool {
	return strings.HasPrefix(msg.Reply, "$JS.") || msg.Header.Get("Status") != ""
}

// ignore counts a stream consumer's message on the registration subjects
// and warns at most once a minute, naming the consumer: it was made by a
// pusher's credential, and an administrator of the stream deletes it.
func (rs *Registrations) ignore(msg *nats.Msg) {
	n := rs.ignored.Add(1)
	now := time.Now().UnixNano()
	last := rs.warned.Load()
	if now-last < int64(time.Minute) || !rs.warned.CompareAndSwap(last, now) {
		return
	}
	consumer := "(a flow control message or heartbeat)"
	// $JS.ACK.<stream>.<consumer>.…, or with a domain and account hash
	// $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.…
	if f := strings.Split(msg.Reply, "."); len(f) >= 4 && f[1] == "ACK" {
		consumer = f[2] + "/" + f[3]
		if len(f) >= 12 {
			consumer = f[4] + "/" + f[5]
		}
	}
	rs.Log.Warn("messages a stream consumer delivers to the registration subjects are dropped: a consumer made by a pusher's NATS credential; delete it",
		"subject", msg.Subject, "consumer", consumer, "dropped", n)
}

// registrationBuffer is how many registrations wait to be read before
// NATS drops the next.
const registrationBuffer = 4096

// Run subscribes until ctx is done. A message that does not decode or
// validate is logged and dropped (a connect is refused with the reason).
func (rs *Registrations) Run(ctx context.Context, handle func(context.Context, model.Registration) error) error {
	msgs := make(chan *nats.Msg, registrationBuffer)
	sub, err := rs.NATS.Subscribe(RegistryPrefix+".*", func(msg *nats.Msg) {
		if jetStreamDelivery(msg) {
			rs.ignore(msg)
			return
		}
		select {
		case msgs <- msg:
		default:
			rs.full.Add(1)
		}
	})
	if err != nil {
		return fmt.Errorf("bus: subscribe to registrations: %w", err)
	}
	rs.sub.Store(sub)
	defer func() { rs.Lost(); rs.sub.Store(nil); _ = sub.Unsubscribe() }()
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
