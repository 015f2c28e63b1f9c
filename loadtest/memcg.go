package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// memcg holds processes to a memory limit as a container's is held: a
// memory cgroup (v1 or v2) made under the load test's own, whose limit
// the kernel enforces by killing a process of it.
type memcg struct {
	dir string
	v2  bool
}

// newMemcg makes a memory cgroup named name under the load test's own,
// limited to limit bytes. It needs write access to the cgroup tree (root
// on a machine, or a container that delegates it).
func newMemcg(name string, limit int64) (*memcg, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var base string
	var v2 bool
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-id:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if listHas(parts[1], "memory") {
			base = filepath.Join("/sys/fs/cgroup/memory", parts[2])
			break
		}
		if parts[0] == "0" && parts[1] == "" {
			if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
				base, v2 = filepath.Join("/sys/fs/cgroup", parts[2]), true
			}
		}
	}
	if base == "" {
		return nil, errors.New("memcg: no memory cgroup of this process found")
	}
	m := &memcg{dir: filepath.Join(base, name), v2: v2}
	if err := os.Mkdir(m.dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("memcg: %w", err)
	}
	file := "memory.limit_in_bytes"
	if v2 {
		file = "memory.max"
	}
	if err := os.WriteFile(filepath.Join(m.dir, file), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		m.remove()
		return nil, fmt.Errorf("memcg: limit: %w", err)
	}
	return m, nil
}

// listHas reports whether a comma-separated list holds s.
func listHas(list, s string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == s {
			return true
		}
	}
	return false
}

// add moves a process into the cgroup.
func (m *memcg) add(pid int) error {
	if err := os.WriteFile(filepath.Join(m.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("memcg: add %d: %w", pid, err)
	}
	return nil
}

// oomKills is how many processes the kernel killed for the limit.
func (m *memcg) oomKills() int {
	file := "memory.oom_control"
	if m.v2 {
		file = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(m.dir, file))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// remove removes the cgroup once its processes are gone.
func (m *memcg) remove() { _ = os.Remove(m.dir) }
