package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/shardpilot/shardpilot/internal/app"
	"github.com/shardpilot/shardpilot/pkg/store"
)

// analyze prints what the ingesters rejected, and the fields they applied
// without (warnings): each source's problems, as its leader reports them.
func analyze(ctx context.Context, o *options, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q", args)
	}
	ms, err := o.find(ctx, "ingester")
	if err != nil {
		return err
	}
	var mu sync.Mutex
	problems := []app.Problem{}
	askErr := askEach(ctx, o, ms, func(ctx context.Context, m store.Member) error {
		var got []app.Problem
		if err := o.get(ctx, m, "/debug/problems", &got); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		problems = append(problems, got...)
		return nil
	})
	// A replica lists only the sources it leads; during a handover two
	// may list the same problem once each.
	slices.SortFunc(problems, func(a, b app.Problem) int {
		return cmp.Or(cmp.Compare(a.Source, b.Source), cmp.Compare(a.Location, b.Location),
			cmp.Compare(a.Resource, b.Resource), cmp.Compare(a.Field, b.Field), cmp.Compare(a.Reason, b.Reason), cmpBool(a.Warning, b.Warning))
	})
	problems = slices.Compact(problems)
	if o.output != "table" {
		return cmp.Or(writeOutput(o, problems), askErr)
	}
	if len(problems) == 0 {
		fmt.Fprintf(o.stdout, "No rejected objects (%d ingesters asked).\n", len(ms))
		return askErr
	}
	t := newTable(o.stdout, "SOURCE", "LOCATION", "RESOURCE", "SEVERITY", "FIELD", "REASON")
	for _, p := range problems {
		severity := "rejected"
		if p.Warning {
			severity = "warning"
		}
		t.row(p.Source, p.Location, p.Resource, severity, p.Field, p.Reason)
	}
	return cmp.Or(t.flush(), askErr)
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}
