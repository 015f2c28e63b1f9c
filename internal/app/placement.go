package app

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardpilot/shardpilot/pkg/model"
)

// ParseNamespaces reads a placement: namespace names separated by commas,
// spaces or lines, "#" starting a comment to the end of its line. where
// names the input in errors. None is a placement too (a shard being
// emptied serves no proxy).
func ParseNamespaces(text, where string) ([]string, error) {
	var out []string
	for i, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, "#")
		for _, ns := range strings.FieldsFunc(line, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\r' }) {
			if !ValidNamespace(ns) {
				return nil, fmt.Errorf("%s: line %d: %q is not a namespace name (lower-case letters, digits and '-', at most 63)", where, i+1, ns)
			}
			out = append(out, ns)
		}
	}
	return slices.Compact(slices.Sorted(slices.Values(out))), nil
}

// ValidNamespace says whether ns is a Kubernetes namespace name (a DNS label).
func ValidNamespace(ns string) bool {
	return len(ns) <= 63 && !strings.ContainsAny(ns, ".*") && ns == strings.ToLower(ns) && model.ValidHostname(ns)
}

// readPlacement reads and parses a placement file.
func readPlacement(path string) ([]byte, []string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("namespaces file: %w", err)
	}
	ns, err := ParseNamespaces(string(b), path)
	return b, ns, err
}

// watchPlacement reads the placement file every period and calls place
// with the namespaces it lists whenever its content changes (a ConfigMap
// mounted as a volume is replaced whole, so a read sees an old or a new
// version). A file that cannot be read or parsed is reported and the last
// placement kept.
func watchPlacement(ctx context.Context, path string, last []byte, every time.Duration, log *slog.Logger, failures prometheus.Counter, place func([]string)) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	var failed string
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		b, ns, err := readPlacement(path)
		if err != nil {
			failures.Inc()
			if err.Error() != failed {
				failed = err.Error()
				log.Error("the namespaces file is unreadable; keeping the namespaces served", "err", err)
			}
			continue
		}
		failed = ""
		if bytes.Equal(b, last) {
			continue
		}
		last = b
		place(ns)
	}
}
