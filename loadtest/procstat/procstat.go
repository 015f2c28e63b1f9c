// Package procstat samples a process's CPU time and resident memory from
// /proc (Linux).
package procstat

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// clockTicks is the kernel's USER_HZ, 100 on every Linux this runs on.
const clockTicks = 100

// Sample is one reading of a process.
type Sample struct {
	At time.Time
	// CPU is the user and system time the process has used.
	CPU time.Duration
	// RSS is its resident memory in bytes.
	RSS int64
}

// Read reads a process's CPU time and resident memory.
func Read(pid int) (Sample, error) {
	s := Sample{At: time.Now()}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("procstat: %w", err)
	}
	// Fields after the command name (which may hold spaces) start at ") ".
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return s, fmt.Errorf("procstat: /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 22 {
		return s, fmt.Errorf("procstat: /proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	rss, err3 := strconv.ParseInt(f[21], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return s, fmt.Errorf("procstat: /proc/%d/stat: unreadable times or rss", pid)
	}
	s.CPU = time.Duration(utime+stime) * time.Second / clockTicks
	s.RSS = rss * int64(os.Getpagesize())
	return s, nil
}

// Sampler reads processes at an interval.
type Sampler struct {
	mu      sync.Mutex
	samples map[int][]Sample
}

// Run samples the processes every interval until ctx is done.
func (s *Sampler) Run(ctx context.Context, interval time.Duration, pids ...int) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for _, pid := range pids {
			if v, err := Read(pid); err == nil {
				s.mu.Lock()
				if s.samples == nil {
					s.samples = map[int][]Sample{}
				}
				s.samples[pid] = append(s.samples[pid], v)
				s.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Samples returns a process's samples so far.
func (s *Sampler) Samples(pid int) []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Sample(nil), s.samples[pid]...)
}
