package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/telemetry"
)

// finding is one weak setting and the replicas that report it.
type finding struct {
	telemetry.Weakness
	Replicas []string `json:"replicas"`
}

// securityCheck asks every pusher and ingester for its weak settings
// (/debug/security) and lists each once with the replicas that have it.
// It fails when one is of high severity, so that it can gate a rollout.
func securityCheck(ctx context.Context, o *options, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q", args)
	}
	var ms []store.Member
	for _, role := range []string{"pusher", "ingester"} {
		found, err := o.find(ctx, role)
		if err != nil {
			return err
		}
		ms = append(ms, found...)
	}
	var mu sync.Mutex
	byWeakness := map[telemetry.Weakness][]string{}
	askErr := askEach(ctx, o, ms, func(ctx context.Context, _ int, m store.Member) error {
		var got []telemetry.Weakness
		if err := o.get(ctx, m, "/debug/security", &got); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, w := range got {
			byWeakness[w] = append(byWeakness[w], m.Role+" "+m.Name)
		}
		return nil
	})
	findings := []finding{}
	high := 0
	for w, replicas := range byWeakness {
		slices.Sort(replicas)
		findings = append(findings, finding{Weakness: w, Replicas: slices.Compact(replicas)})
		if w.Severity == telemetry.High {
			high++
		}
	}
	slices.SortFunc(findings, func(a, b finding) int {
		return cmp.Or(cmp.Compare(a.Severity, b.Severity), cmp.Compare(a.Setting, b.Setting), cmp.Compare(a.Risk, b.Risk))
	})
	if o.output != "table" {
		if err := writeOutput(o, findings); err != nil {
			return err
		}
	} else if len(findings) == 0 {
		fmt.Fprintf(o.stdout, "No weak settings (%d pushers and ingesters asked).\n", len(ms))
	} else {
		t := newTable(o.stdout, "SEVERITY", "SETTING", "RISK", "REPLICAS")
		for _, f := range findings {
			t.row(f.Severity, f.Setting, f.Risk, replicaList(f.Replicas))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if high > 0 {
		return cmp.Or(askErr, fmt.Errorf("%d weak settings of high severity (docs/security.md says what each costs)", high))
	}
	return askErr
}

// replicaList names up to three replicas and counts the rest.
func replicaList(rs []string) string {
	if len(rs) <= 3 {
		return strings.Join(rs, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(rs[:3], ", "), len(rs)-3)
}
