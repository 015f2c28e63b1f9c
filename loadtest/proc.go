package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a control-plane process the phase started.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	// ads and admin are its addresses (admin empty for the baseline);
	// heap serves /debug/pprof/heap.
	ads, admin, heap string
}

// freeAddr returns a loopback address nobody listens on, for a process
// to listen on soon. Its port is below Linux's ephemeral range (32768 and
// up), where a port the kernel picked would be: the thousands of proxy
// connections a phase opens take ephemeral ports, and one of them could
// take the port before the process binds it.
func freeAddr() (string, error) {
	var last error
	for range 100 {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000)))
		if err != nil {
			last = err
			continue
		}
		addr := l.Addr().String()
		l.Close()
		return addr, nil
	}
	return "", fmt.Errorf("no free port from 20000 to 32000: %w", last)
}

func start(out, name, bin string, args ...string) (*proc, error) {
	return startWith(nil, out, name, bin, args...)
}

// startWith is start with env added to the process's environment.
func startWith(env []string, out, name, bin string, args ...string) (*proc, error) {
	f, err := os.Create(filepath.Join(out, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &proc{name: name, cmd: cmd, log: f}, nil
}

// stop ends a process with SIGTERM, then SIGKILL after a grace period.
func (p *proc) stop() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
	}
	p.log.Close()
}

// terminate sends SIGTERM and reports whether the process ended within d
// (it is killed if not).
func (p *proc) terminate(d time.Duration) bool {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		// SIGQUIT first: the Go runtime writes every goroutine's stack to
		// the process's log, which says where it was stuck.
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
		return false
	}
}

// kill ends a process at once, as a crash would.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// ready reports whether /readyz answers 200.
func (p *proc) ready() bool { return httpOK("http://" + p.admin + "/readyz") }

// httpOK reports whether a GET of url answers 200 within a second.
func httpOK(url string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// staleness returns a pusher's shardpilot_pusher_stale_seconds and, when
// it is stale, the reason its /readyz gives (0 and "" when it cannot be
// read).
func (p *proc) staleness() (float64, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.admin + "/metrics")
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	var v float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if s, ok := strings.CutPrefix(sc.Text(), "shardpilot_pusher_stale_seconds "); ok {
			v, _ = strconv.ParseFloat(s, 64)
			break
		}
	}
	if v == 0 {
		return 0, ""
	}
	why := ""
	if resp, err := c.Get("http://" + p.admin + "/readyz"); err == nil {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "stale") {
				why = line
			}
		}
	}
	return v, why
}

// stale reports whether a pusher says it does not follow the store
// (shardpilot_pusher_stale_seconds above 0).
func (p *proc) stale() bool {
	v, _ := p.staleness()
	return v > 0
}

// waitReady polls /readyz, or for the baseline its ADS port.
func (p *proc) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p.admin != "" {
			if p.ready() {
				return nil
			}
		} else if c, err := net.DialTimeout("tcp", p.ads, time.Second); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s was not ready within %s (see its log in the output directory)", p.name, timeout)
}
