package main

import (
	"context"
	"fmt"
	"io"
	"syscall"

	"github.com/shardpilot/shardpilot/loadtest/report"
)

// capacityTrials bounds the phases a capacity search runs.
const capacityTrials = 8

// maxProxies is the most proxies a trial may run: each holds a file
// descriptor in the load test and one in the pusher, within the hard
// limit of open files less what the processes need besides.
func maxProxies() int {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil || l.Max > 1<<20 {
		return 1 << 20
	}
	return int(l.Max) - 1000
}

// capacity finds, by doubling from sc.Proxies and then bisecting, the most
// proxies one pusher keeps at convergence p99 within sc.Capacity under the
// scenario's changes: a trial passes when every proxy got a full config
// and every change reached every proxy, its p99 within the bound. The
// search stops when the largest passing and the smallest failing count are
// within a tenth of each other (or 100 proxies), after capacityTrials
// trials, or at the limit of open files. Every trial is a phase of the
// report.
func capacity(ctx context.Context, sc Scenario, stderr io.Writer) (report.Capacity, []report.Phase, error) {
	c := report.Capacity{Bound: sc.Capacity.Seconds(), Limit: maxProxies()}
	var phases []report.Phase
	lo, hi := 0, 0 // the largest count that passed, the smallest that failed
	n := min(sc.Proxies, c.Limit)
	for range capacityTrials {
		trial := sc
		trial.Proxies = n
		ph, err := phase(ctx, trial, target{pushers: 1}, stderr)
		if err != nil {
			return c, phases, err
		}
		ph.Name = fmt.Sprintf("shardpilot, 1 pusher, %d proxies", n)
		ok := len(ph.Problems) == 0 && ph.Unconverged == 0 && ph.Changes > 0 && ph.Convergence.P99 <= c.Bound
		phases = append(phases, ph)
		c.Trials = append(c.Trials, report.Trial{Proxies: n, P99: ph.Convergence.P99, CPUPerChange: ph.CPUPerChange,
			HarnessCPUSeconds: ph.HarnessCPUSeconds, OK: ok})
		fmt.Fprintf(stderr, "== capacity: %d proxies: p99 %.3f s, %d problems: passed %v\n", n, ph.Convergence.P99, len(ph.Problems), ok)
		if ok {
			lo = n
		} else {
			hi = n
		}
		switch {
		case lo == 0 && n <= 100:
			c.Proxies = 0
			return c, phases, nil
		case lo == 0:
			n /= 2
		case hi == 0 && n >= c.Limit:
			c.Proxies, c.AtLimit = lo, true
			return c, phases, nil
		case hi == 0:
			n = min(2*n, c.Limit)
		case hi-lo <= max(lo/10, 100):
			c.Proxies = lo
			return c, phases, nil
		default:
			n = (lo + hi) / 2
		}
	}
	c.Proxies = lo
	return c, phases, nil
}
