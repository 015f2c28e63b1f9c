package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// natsFSSize is the size of the file system NATS keeps its stream on in
// the fault suite: ample for the suite's stream, small to fill.
const natsFSSize = 256 << 20

// mountNATSFS makes dir a file system of its own (a tmpfs of natsFSSize)
// for NATS's store, so that the suite can fill it; it returns why not
// when it cannot (mounting needs root).
func mountNATSFS(dir string) (unmount func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", natsFSSize)); err != nil {
		return nil, fmt.Errorf("mount a tmpfs for NATS's store at %s: %w (the fault needs root)", dir, err)
	}
	return func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) }, nil
}

// fill writes a file into dir until its file system has no space left,
// and returns what removes it.
func fill(dir string) (free func(), err error) {
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	chunk := make([]byte, 1<<20)
	for {
		if _, err = f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		os.Remove(path)
		return nil, fmt.Errorf("fill %s: %w", dir, err)
	}
	return func() { os.Remove(path) }, nil
}

// natsDiskFull fills the file system NATS keeps the change stream on for
// the fault hold, under churn. JetStream, out of space, shuts itself down
// and stays down when the space is back, until NATS restarts: the suite
// restarts it once the space is freed, as a liveness probe on its
// /healthz?js-enabled-only=true does (docs/operations.md). Meanwhile the
// pushers must stay ready and say they are behind the store; after the
// restart the relay must bring the stream back, and every change made
// must reach every proxy.
func (r *faultRig) natsDiskFull() error {
	if r.natsFSErr != nil {
		return r.natsFSErr
	}
	free, err := fill(r.natsDir)
	if err != nil {
		return err
	}
	s := r.watchSignals(r.sc.FaultHold, nil)
	free()
	port := r.natsURL[strings.LastIndex(r.natsURL, ":")+1:]
	r.nats.stop()
	p, _, _, err := startStore(r.ctx, r.sc.out, "faults-nats-restarted", r.natsDir, "--only", "nats", "--nats-port", port)
	if err != nil {
		return err
	}
	r.procs, r.nats = append(r.procs, p), p
	restarted := time.Now()
	back := r.watchSignals(time.Minute, r.following(restarted, 2*time.Second))
	r.said = fmt.Sprintf("while full: %s; after the restart: %s, following again %.1fs after it", s, back, time.Since(restarted).Seconds())
	switch {
	case len(s.unready) > 0 || len(back.unready) > 0:
		return fmt.Errorf("a pusher went unready: %s", r.said)
	case s.maxStale == 0:
		return fmt.Errorf("no pusher said it was behind the store while NATS could not store the changes: %s", r.said)
	}
	return nil
}
