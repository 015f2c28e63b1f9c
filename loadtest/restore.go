package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/shardpilot/shardpilot/loadtest/meshgen"
)

// etcdRestored restores etcd from a snapshot taken a third of the fault
// hold earlier, under churn, where its clients look (the same port), as an
// operator recovering a broken etcd would: the store's revisions go back,
// and what was committed since the snapshot is gone from it. The relay
// must start a new history the pushers obey, the ingesters must write
// again what the store lost, and the pushers stay ready. Every change must
// still reach every proxy, the reverted ones too: a proxy's held
// configuration must come back to each service's newest change.
func (r *faultRig) etcdRestored() error {
	snap := filepath.Join(r.work, "etcd.snapshot")
	if err := r.snapshot(snap); err != nil {
		return err
	}
	time.Sleep(r.sc.FaultHold / 3)
	port := r.etcdURL[strings.LastIndex(r.etcdURL, ":")+1:]
	r.etcd.kill()
	p, _, _, err := startStore(r.ctx, r.sc.out, "faults-etcd-restored", r.work, "--only", "etcd", "--etcd-port", port, "--etcd-restore", snap)
	if err != nil {
		return err
	}
	r.procs, r.etcd = append(r.procs, p), p
	restored := time.Now()
	var behind []string
	following := r.following(restored, 5*time.Second)
	s := r.watchSignals(time.Minute, func() bool {
		if !following() {
			return false
		}
		behind = behind[:0]
		for _, k := range r.tracker.Behind(func(c meshgen.Change) bool { return r.mesh.Sees(c, 0) }) {
			behind = append(behind, fmt.Sprintf("%v/%d", k.Kind, k.Service))
		}
		return len(behind) == 0
	})
	r.said = fmt.Sprintf("%s; a proxy held every service's newest change again %.1fs after the restore", s, time.Since(restored).Seconds())
	switch {
	case len(s.unready) > 0:
		return fmt.Errorf("a pusher went unready: %s", r.said)
	case len(behind) > 0:
		return fmt.Errorf("a minute after the restore, a proxy still holds older changes of %d keys than were made (%s): the store's lost changes were not written again", len(behind), strings.Join(behind[:min(len(behind), 5)], " "))
	}
	return nil
}

// snapshot writes a snapshot of etcd to path.
func (r *faultRig) snapshot(path string) error {
	rc, err := r.cli.Snapshot(r.ctx)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	defer rc.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.ReadFrom(rc); err != nil {
		f.Close()
		return fmt.Errorf("snapshot: %w", err)
	}
	return f.Close()
}
