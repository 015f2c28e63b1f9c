package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/model"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// signals is what the pushers said while a fault lasted: whether each
// stayed ready, and how long and why it said it was stale at most.
type signals struct {
	unready  []string
	maxStale float64
	reason   string
}

func (s signals) String() string {
	ready := "ready throughout"
	if len(s.unready) > 0 {
		ready = "unready: " + strings.Join(s.unready, ", ")
	}
	if s.maxStale == 0 {
		return ready + "; never stale"
	}
	return fmt.Sprintf("%s; stale up to %.0fs (%s)", ready, s.maxStale, s.reason)
}

// watchSignals samples the pushers' readiness and staleness every 200 ms
// until done returns true or hold has passed.
func (r *faultRig) watchSignals(hold time.Duration, done func() bool) signals {
	var s signals
	unready := map[string]bool{}
	for until := time.Now().Add(hold); time.Now().Before(until) && r.ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
		for _, p := range r.servers {
			if !p.ready() && !unready[p.name] {
				unready[p.name] = true
				s.unready = append(s.unready, p.name)
			}
			if v, why := p.staleness(); v > s.maxStale {
				s.maxStale, s.reason = v, why
			}
		}
		if done != nil && done() {
			break
		}
	}
	return s
}

// following is a watchSignals condition: settle has passed since from,
// and every pusher follows the store (is not stale).
func (r *faultRig) following(from time.Time, settle time.Duration) func() bool {
	return func() bool {
		if time.Since(from) < settle {
			return false
		}
		for _, p := range r.servers {
			if v, _ := p.staleness(); v > 0 {
				return false
			}
		}
		return true
	}
}

// foreignValues writes into etcd, past the ingester, what the bus cannot
// carry as it is: a valid Service over NATS's payload limit (under etcd's),
// a Service in a namespace holding a space (no subject token), and bytes
// that decode as no Service; it holds them a third of the fault hold while
// the churn goes on, then removes them. The pushers must stay ready and
// never fall behind the store for long: the stream must not wedge.
func (r *faultRig) foreignValues() error {
	labels := map[string]string{}
	for i := range 1000 {
		labels[fmt.Sprintf("label-%04d", i)] = strings.Repeat("v", 1200)
	}
	big, err := proto.Marshal(&meshv1.Service{Origin: &meshv1.Origin{Source: "elsewhere"}, Hostnames: []string{"big.faults.svc.cluster.local"},
		Resolution: meshv1.Resolution_RESOLUTION_STATIC, Labels: labels, Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}})
	if err != nil {
		return err
	}
	odd, err := proto.Marshal(&meshv1.Service{Origin: &meshv1.Origin{Source: "elsewhere"}, Hostnames: []string{"odd.example.com"},
		Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: []*meshv1.Port{{Name: "tcp", Number: 9000, Protocol: meshv1.Protocol_PROTOCOL_TCP}}})
	if err != nil {
		return err
	}
	values := map[string]string{
		model.Prefix + "services/faults/big":     string(big),
		model.Prefix + "services/my faults/odd":  string(odd),
		model.Prefix + "services/faults/garbage": "\xff\xfe not a service",
	}
	for k, v := range values {
		if _, err := r.cli.Put(r.ctx, k, v); err != nil {
			return fmt.Errorf("put %s: %w", k, err)
		}
	}
	s := r.watchSignals(r.sc.FaultHold/3, nil)
	for k := range values {
		if _, err := r.cli.Delete(r.ctx, k); err != nil {
			return fmt.Errorf("delete %s: %w", k, err)
		}
	}
	r.said = s.String()
	// The value that does not decode makes each pusher load the store
	// again (a moment not following); a wedged stream would be seconds.
	if len(s.unready) > 0 || s.maxStale > 5 {
		return fmt.Errorf("the stream wedged: %s", s)
	}
	return nil
}

// streamDeleted deletes the change stream under churn, as someone with
// NATS's management rights could: the relay makes it again, publishes a
// RESYNC, and the pushers reload; they stay ready meanwhile.
func (r *faultRig) streamDeleted() error {
	nc, err := nats.Connect(r.natsURL, nats.Timeout(5*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cfg := bus.Config{}
	if err := cfg.Validate(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, cfg.Stream); err != nil {
		return fmt.Errorf("delete the stream: %w", err)
	}
	s := r.watchSignals(time.Minute, r.following(time.Now(), 2*time.Second))
	r.said = s.String()
	if len(s.unready) > 0 {
		return fmt.Errorf("a pusher went unready: %s", s)
	}
	return nil
}

// etcdFull raises etcd's NOSPACE alarm (what a full quota raises) for a
// third of the fault hold under churn: every write is refused meanwhile.
// The ingesters must say so (unready, the alarm named), the pushers keep
// serving (ready), and once the alarm is disarmed the changes made during
// it must still reach every proxy.
func (r *faultRig) etcdFull() error {
	status, err := r.cli.Status(r.ctx, r.etcdURL)
	if err != nil {
		return err
	}
	member := status.Header.MemberId
	alarm := &etcdserverpb.AlarmRequest{Action: etcdserverpb.AlarmRequest_ACTIVATE, MemberID: member, Alarm: etcdserverpb.AlarmType_NOSPACE}
	if _, err := etcdserverpb.NewMaintenanceClient(r.cli.ActiveConnection()).Alarm(r.ctx, alarm); err != nil {
		return fmt.Errorf("raise the alarm: %w", err)
	}
	unready := map[string]bool{}
	s := r.watchSignals(r.sc.FaultHold/3, func() bool {
		for id, p := range r.ingesters {
			if !p.ready() {
				unready[id] = true
			}
		}
		return false
	})
	if _, err := r.cli.AlarmDisarm(r.ctx, &clientv3.AlarmMember{MemberID: member, Alarm: etcdserverpb.AlarmType_NOSPACE}); err != nil {
		return fmt.Errorf("disarm the alarm: %w", err)
	}
	r.said = fmt.Sprintf("%s; ingesters unready: %d of %d", s, len(unready), len(r.ingesters))
	switch {
	case len(s.unready) > 0:
		return fmt.Errorf("a pusher went unready: %s", s)
	case len(unready) < len(r.ingesters):
		return fmt.Errorf("%d of %d ingesters said they were unready while etcd refused every write", len(unready), len(r.ingesters))
	}
	return nil
}
