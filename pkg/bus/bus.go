package bus

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"google.golang.org/protobuf/proto"
)

// SubjectPrefix is the first part of every subject the bus uses.
const SubjectPrefix = "mesh.v1"

// Config configures the stream. The zero value of each field takes its default.
type Config struct {
	// Stream is the JetStream stream name. Default SHARDPILOT_MESH.
	Stream string
	// MaxAge bounds how long events are kept. Default 24h.
	MaxAge time.Duration
	// MaxMsgs bounds how many events are kept; 0 keeps them all (within MaxAge).
	MaxMsgs int64
	// Duplicates is the de-duplication window. Default 10m.
	Duplicates time.Duration
	// Replicas is the stream's replica count. Default 1.
	Replicas int
	// Sign, when set, signs every published event (the relay holds it), so
	// that a consumer holding Verify can tell the relay's events from ones
	// a bus credential alone could write.
	Sign ed25519.PrivateKey
	// Verify, when set, are the keys events must be signed with (one of
	// them: two while the relay's key is rotated): an event without a valid
	// signature is refused (model.ErrRefused). With Sign and no Verify, the
	// bus verifies with Sign's public key.
	Verify []ed25519.PublicKey
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Stream == "" {
		c.Stream = "SHARDPILOT_MESH"
	}
	if strings.ContainsAny(c.Stream, ". *>") {
		return fmt.Errorf("bus: stream name %q may not contain '.', ' ', '*' or '>'", c.Stream)
	}
	if c.MaxAge == 0 {
		c.MaxAge = 24 * time.Hour
	}
	if c.Duplicates == 0 {
		c.Duplicates = 10 * time.Minute
	}
	if c.Duplicates > c.MaxAge {
		return fmt.Errorf("bus: duplicates window %s exceeds max age %s", c.Duplicates, c.MaxAge)
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.MaxAge < 0 || c.MaxMsgs < 0 || c.Replicas < 0 {
		return errors.New("bus: max age, max messages and replicas must not be negative")
	}
	if c.Sign != nil && len(c.Sign) != ed25519.PrivateKeySize {
		return fmt.Errorf("bus: signing key of %d bytes, want an ed25519 key", len(c.Sign))
	}
	for _, k := range c.Verify {
		if len(k) != ed25519.PublicKeySize {
			return fmt.Errorf("bus: verifying key of %d bytes, want an ed25519 key", len(k))
		}
	}
	if c.Sign != nil && c.Verify == nil {
		c.Verify = []ed25519.PublicKey{c.Sign.Public().(ed25519.PublicKey)}
	}
	return nil
}

// ErrAltered says the stream is missing or is not configured as the relay
// made it (another subject captured, say): someone with management rights
// changed it.
var ErrAltered = errors.New("bus: stream altered")

// SignatureHeader is the message header that carries an event's signature:
// base64 of ed25519 over the subject, a zero byte and the message data.
const SignatureHeader = "Shardpilot-Signature"

// Bus publishes and consumes change events.
type Bus struct {
	js jetstream.JetStream
	// maxPayload is the largest message the server takes.
	maxPayload func() int64
	stream     string
	config     jetstream.StreamConfig
	sign       ed25519.PrivateKey
	verify     []ed25519.PublicKey
}

// New returns a Bus on cfg's stream; it does no I/O. Only the stream's
// owner (the relay) calls Ensure: a consumer's credentials need not, and
// should not, manage streams. The caller owns nc.
func New(nc *nats.Conn, cfg Config) (*Bus, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(asyncAckTimeout))
	if err != nil {
		return nil, fmt.Errorf("bus: jetstream: %w", err)
	}
	maxMsgs := cfg.MaxMsgs
	if maxMsgs == 0 {
		maxMsgs = -1
	}
	b := &Bus{js: js, maxPayload: nc.MaxPayload, stream: cfg.Stream, sign: cfg.Sign, verify: cfg.Verify, config: jetstream.StreamConfig{
		Name:       cfg.Stream,
		Subjects:   []string{SubjectPrefix + ".>"},
		Retention:  jetstream.LimitsPolicy,
		MaxAge:     cfg.MaxAge,
		MaxMsgs:    maxMsgs,
		Duplicates: cfg.Duplicates,
		Replicas:   cfg.Replicas,
		Storage:    jetstream.FileStorage,
	}}
	return b, nil
}

// Ensure creates the stream if it does not exist (someone deleted it), or
// brings its configuration back.
func (b *Bus) Ensure(ctx context.Context) error {
	if _, err := b.js.CreateOrUpdateStream(ctx, b.config); err != nil {
		return fmt.Errorf("bus: create stream %s: %w", b.stream, err)
	}
	return nil
}

// Check reports ErrAltered when the stream is gone or captures other
// subjects than the relay's, or denies nothing it should (a stream whose
// subjects were widened would store events published elsewhere).
func (b *Bus) Check(ctx context.Context) error {
	s, err := b.js.Stream(ctx, b.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("bus: stream %s is gone: %w", b.stream, ErrAltered)
	}
	if err != nil {
		return fmt.Errorf("bus: stream %s: %w", b.stream, err)
	}
	got := s.CachedInfo().Config
	if !slices.Equal(got.Subjects, b.config.Subjects) {
		return fmt.Errorf("bus: stream %s captures %v, want %v: %w", b.stream, got.Subjects, b.config.Subjects, ErrAltered)
	}
	if got.Sealed || got.DenyDelete != b.config.DenyDelete || got.DenyPurge != b.config.DenyPurge || got.Mirror != nil || len(got.Sources) > 0 {
		return fmt.Errorf("bus: stream %s is sealed, mirrored, sourced or its deny settings changed: %w", b.stream, ErrAltered)
	}
	return nil
}

// headerRoom is what a message's headers (its id, the expected last id,
// the signature) may take of the server's payload limit.
const headerRoom = 4 << 10

// message makes the NATS message of an event, signed when the bus signs;
// a PUT whose value would take the message past the server's payload
// limit is carried by reference (ChangeEvent.by_reference).
func (b *Bus) message(ev *meshv1.ChangeEvent) (*nats.Msg, error) {
	data, err := proto.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("bus: encode event %d: %w", ev.Revision, err)
	}
	limit := b.maxPayload()
	if limit <= 0 {
		limit = 1 << 20 // NATS's default, until the server said its own
	}
	if int64(len(data)) > limit-headerRoom && ev.Type == meshv1.ChangeEvent_TYPE_PUT {
		// Too large for the bus: the event names the key and revision,
		// and the consumer reads the value from the store.
		ref := proto.CloneOf(ev)
		ref.Value, ref.ByReference = nil, true
		if data, err = proto.Marshal(ref); err != nil {
			return nil, fmt.Errorf("bus: encode event %d: %w", ev.Revision, err)
		}
	}
	msg := &nats.Msg{Subject: Subject(ev), Data: data, Header: nats.Header{}}
	if b.sign != nil {
		msg.Header.Set(SignatureHeader, base64.StdEncoding.EncodeToString(ed25519.Sign(b.sign, signed(msg.Subject, data))))
	}
	return msg, nil
}

// signed is what a signature covers: the subject and the event.
func signed(subject string, data []byte) []byte {
	out := make([]byte, 0, len(subject)+1+len(data))
	out = append(append(append(out, subject...), 0), data...)
	return out
}

// decode returns the event a message carries, or an error wrapping
// model.ErrRefused when the relay cannot have published it there: a subject its
// key does not map to, or a missing or wrong signature when the bus
// verifies. A message that does not decode is returned as nil, no error.
func (b *Bus) decode(seq uint64, subject string, header nats.Header, data []byte) (*meshv1.ChangeEvent, error) {
	if b.verify != nil {
		sig, err := base64.StdEncoding.DecodeString(header.Get(SignatureHeader))
		if err != nil || len(sig) == 0 {
			return nil, fmt.Errorf("bus: sequence %d on %s: no valid signature: %w", seq, subject, model.ErrRefused)
		}
		msg := signed(subject, data)
		if !slices.ContainsFunc(b.verify, func(k ed25519.PublicKey) bool { return ed25519.Verify(k, msg, sig) }) {
			return nil, fmt.Errorf("bus: sequence %d on %s: the signature does not verify: %w", seq, subject, model.ErrRefused)
		}
	}
	ev := &meshv1.ChangeEvent{}
	if err := proto.Unmarshal(data, ev); err != nil {
		if !strings.HasPrefix(subject, SubjectPrefix+".") {
			return nil, fmt.Errorf("bus: sequence %d on %s: not a mesh subject: %w", seq, subject, model.ErrRefused)
		}
		return nil, nil
	}
	if want := Subject(ev); subject != want {
		return nil, fmt.Errorf("bus: sequence %d: event %s at revision %d on subject %s, want %s: %w", seq, ev.Key, ev.Revision, subject, want, model.ErrRefused)
	}
	return ev, nil
}

// Subject returns the subject an event is published on.
func Subject(ev *meshv1.ChangeEvent) string {
	if ev.Type == meshv1.ChangeEvent_TYPE_RESYNC {
		return SubjectPrefix + "._resync"
	}
	k, err := model.ParseKey(ev.Key)
	if err != nil || !token(k.Namespace) {
		// A subject NATS would refuse, or one of several tokens that a
		// scope's filter would not take: the consumers of every scope
		// follow this one.
		return SubjectPrefix + "._unknown"
	}
	return SubjectPrefix + "." + string(k.Kind) + "." + k.Namespace
}

// token reports whether s is one subject token NATS takes as it is: not
// empty, no separator, wildcard, space or control character.
func token(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f || r == '.' || r == '*' || r == '>' {
			return false
		}
	}
	return true
}

// MsgID returns the de-duplication id of an event: its revision, with the
// event's index when the revision holds several events, and its epoch
// after the first.
func MsgID(ev *meshv1.ChangeEvent) string {
	id := strconv.FormatInt(ev.Revision, 10)
	if ev.Epoch != 0 {
		// A later history of the store (restored) reuses revisions.
		id = "e" + strconv.FormatInt(ev.Epoch, 10) + "." + id
	}
	switch {
	case ev.Type == meshv1.ChangeEvent_TYPE_RESYNC && ev.Index != 0:
		return "resync-" + id + "." + strconv.Itoa(int(ev.Index))
	case ev.Type == meshv1.ChangeEvent_TYPE_RESYNC:
		return "resync-" + id
	case ev.Count > 1:
		return id + "." + strconv.Itoa(int(ev.Index))
	}
	return id
}

// Publish publishes one event and waits for the stream to store it. It
// reports whether the stream already had it.
func (b *Bus) Publish(ctx context.Context, ev *meshv1.ChangeEvent) (duplicate bool, err error) {
	msg, err := b.message(ev)
	if err != nil {
		return false, err
	}
	ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithMsgID(MsgID(ev)))
	if err != nil {
		return false, publishError(ev, err)
	}
	return ack.Duplicate, nil
}

// publishError wraps a failed publish, marking with model.ErrNotStored the
// failures where the bus answered and refused (a JetStream API error such
// as a wrong last message id or no resources; a message over the payload
// limit or on a subject the server refuses) from those where it did not
// answer.
func publishError(ev *meshv1.ChangeEvent, err error) error {
	var api *jetstream.APIError
	if errors.As(err, &api) || errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) {
		return fmt.Errorf("bus: publish revision %d: %w (%w)", ev.Revision, err, model.ErrNotStored)
	}
	return fmt.Errorf("bus: publish revision %d: %w", ev.Revision, err)
}

// asyncAckTimeout bounds the wait for the answer to a publish that does
// not wait.
const asyncAckTimeout = 10 * time.Second

// PublishAfter publishes ev without waiting for the stream to store it, on
// the condition that the last event the stream holds is after: the stream
// refuses it otherwise, so that events are stored in order or not at all
// (when one is lost in flight, every later one fails too). ack waits for
// the stream's answer and reports whether it already had the event.
func (b *Bus) PublishAfter(ev, after *meshv1.ChangeEvent) (ack func(context.Context) (duplicate bool, err error), err error) {
	msg, err := b.message(ev)
	if err != nil {
		return nil, err
	}
	f, err := b.js.PublishMsgAsync(msg,
		jetstream.WithMsgID(MsgID(ev)), jetstream.WithExpectLastMsgID(MsgID(after)))
	if err != nil {
		return nil, publishError(ev, err)
	}
	return func(ctx context.Context) (bool, error) {
		select {
		case a := <-f.Ok():
			return a.Duplicate, nil
		case err := <-f.Err():
			return false, publishError(ev, err)
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}, nil
}

// Last returns the last event in the stream and its sequence, or nil and 0
// when the stream is empty. An event the relay cannot have published there
// is an error wrapping model.ErrRefused.
func (b *Bus) Last(ctx context.Context) (*meshv1.ChangeEvent, uint64, error) {
	seq, err := b.LastSeq(ctx)
	if err != nil || seq == 0 {
		return nil, 0, err
	}
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return nil, 0, fmt.Errorf("bus: stream %s: %w", b.stream, err)
	}
	msg, err := s.GetMsg(ctx, seq)
	if err != nil {
		return nil, 0, fmt.Errorf("bus: get message %d: %w", seq, err)
	}
	ev, err := b.decode(seq, msg.Subject, msg.Header, msg.Data)
	if err != nil {
		return nil, 0, err
	}
	if ev == nil {
		return nil, 0, fmt.Errorf("bus: message %d does not decode: %w", seq, model.ErrRefused)
	}
	return ev, seq, nil
}

// streamCheck is how long Consume waits for a message before it checks
// that its stream is still the one it started on.
const streamCheck = 2 * time.Second

// created returns when the stream was created.
func (b *Bus) created(ctx context.Context) (time.Time, error) {
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return time.Time{}, fmt.Errorf("bus: stream %s: %w", b.stream, err)
	}
	return s.CachedInfo().Created, nil
}

// LastSeq returns the sequence of the last message in the stream (0 when empty).
func (b *Bus) LastSeq(ctx context.Context) (uint64, error) {
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return 0, fmt.Errorf("bus: stream %s: %w", b.stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("bus: stream %s info: %w", b.stream, err)
	}
	return info.State.LastSeq, nil
}

// Consume calls fn for every event from stream sequence fromSeq on, in
// order, until ctx is done (returning ctx.Err()), fn fails (returning its
// error), a sequence is missing (returning model.ErrGap), or a message is
// not an event the relay published there (returning an error wrapping
// model.ErrRefused: its subject is not its key's, or, when the bus verifies, its
// signature is missing or wrong). Messages on a mesh subject that do not
// decode are passed to fn as nil events so the caller can count them; their
// sequence still advances.
func (b *Bus) Consume(ctx context.Context, fromSeq uint64, fn func(seq uint64, ev *meshv1.ChangeEvent) error) error {
	return b.ConsumeSubjects(ctx, fromSeq, nil, fn)
}

// ConsumeNamespaces is Consume for the events of some namespaces alone
// and those every namespace sees (ConsumeSubjects of ScopeSubjects).
func (b *Bus) ConsumeNamespaces(ctx context.Context, fromSeq uint64, namespaces []string, fn func(seq uint64, ev *meshv1.ChangeEvent) error) error {
	return b.ConsumeSubjects(ctx, fromSeq, ScopeSubjects(namespaces), fn)
}

// ConsumeSubjects is Consume for the events of some subjects alone (all of
// them for none; see ScopeSubjects): the stream sends no other, so its
// sequence skips theirs. A missing event of these subjects is told apart
// from the others' by the stream: once nothing of theirs is pending, every
// sequence up to the stream's last is accounted for, and one the stream no
// longer holds (its oldest is past the next expected) is a gap.
func (b *Bus) ConsumeSubjects(ctx context.Context, fromSeq uint64, subjects []string, fn func(seq uint64, ev *meshv1.ChangeEvent) error) error {
	if fromSeq == 0 {
		fromSeq = 1
	}
	filtered := len(subjects) > 0
	cons, err := b.js.OrderedConsumer(ctx, b.stream, jetstream.OrderedConsumerConfig{
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    fromSeq,
		FilterSubjects: subjects,
		// A consumer lost with its stream (NATS restarted without its
		// data) is made again a few times, then the consume fails and
		// its caller starts over: retried for ever, the iterator would
		// neither return nor heed the context.
		MaxResetAttempts: 3,
	})
	if err != nil {
		return fmt.Errorf("bus: consume %s from %d: %w", b.stream, fromSeq, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("bus: consume %s from %d: %w", b.stream, fromSeq, err)
	}
	defer it.Stop()
	created, err := b.created(ctx)
	if err != nil {
		return err
	}
	next := fromSeq
	if filtered {
		if err := b.holds(ctx, next); err != nil {
			return err
		}
	}
	for {
		wait, cancel := context.WithTimeout(ctx, streamCheck)
		msg, err := it.Next(jetstream.NextContext(wait))
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrOrderedConsumerReset) {
				// Quiet for a while, or the consumer was recreated: the
				// stream may have been deleted (and made again by the
				// relay), holding none of the sequences expected next.
				now, err := b.created(ctx)
				if err != nil {
					return err
				}
				if !now.Equal(created) {
					return fmt.Errorf("bus: stream %s was recreated: %w", b.stream, model.ErrGap)
				}
				if filtered {
					if next, err = b.caughtUp(ctx, cons, next); err != nil {
						return err
					}
				}
				continue
			}
			return fmt.Errorf("bus: consume %s: %w", b.stream, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("bus: consume %s: metadata: %w", b.stream, err)
		}
		switch {
		case !filtered && meta.Sequence.Stream != next:
			return fmt.Errorf("bus: wanted sequence %d, got %d: %w", next, meta.Sequence.Stream, model.ErrGap)
		case filtered && meta.Sequence.Stream < next:
			return fmt.Errorf("bus: wanted sequence %d or later, got %d: %w", next, meta.Sequence.Stream, model.ErrGap)
		}
		next = meta.Sequence.Stream + 1
		ev, err := b.decode(meta.Sequence.Stream, msg.Subject(), msg.Headers(), msg.Data())
		if err != nil {
			return err
		}
		if err := fn(meta.Sequence.Stream, ev); err != nil {
			return err
		}
	}
}

// holds checks that the stream still holds sequence next (or has not
// reached it): an older one has been dropped with whatever it carried.
func (b *Bus) holds(ctx context.Context, next uint64) error {
	info, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return fmt.Errorf("bus: stream %s info: %w", b.stream, err)
	}
	if first := info.CachedInfo().State.FirstSeq; first > next {
		return fmt.Errorf("bus: stream %s starts at %d, events from %d are gone: %w", b.stream, first, next, model.ErrGap)
	}
	return nil
}

// caughtUp returns the next sequence a filtered consumer waits for: past
// the stream's last when none of its subjects' events is pending (so that
// the others' ageing out is no gap), after checking the stream holds it.
func (b *Bus) caughtUp(ctx context.Context, cons jetstream.Consumer, next uint64) (uint64, error) {
	last, err := b.LastSeq(ctx)
	if err != nil {
		return next, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return next, fmt.Errorf("bus: consumer info: %w", err)
	}
	if info.NumPending == 0 && last+1 > next {
		next = last + 1
	}
	return next, b.holds(ctx, next)
}

// ScopeSubjects are the subjects of the events a pusher scoped to some
// namespaces follows: every kind in those namespaces, every object of the
// mesh-wide kinds (model.MeshWide), resyncs and events of unknown keys.
func ScopeSubjects(namespaces []string) []string {
	out := []string{SubjectPrefix + "._resync", SubjectPrefix + "._unknown"}
	for _, k := range model.Kinds {
		if model.MeshWide(k) {
			out = append(out, SubjectPrefix+"."+string(k)+".>")
		}
	}
	// Filters must not overlap: the namespaces' subjects name every other kind.
	for _, ns := range namespaces {
		for _, k := range model.Kinds {
			if !model.MeshWide(k) {
				out = append(out, SubjectPrefix+"."+string(k)+"."+ns)
			}
		}
	}
	return out
}
