package main

import (
	"cmp"
	"context"
	"fmt"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"github.com/shardpilot/shardpilot/pkg/ingest/yamldir"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shardpilot/shardpilot/internal/app"
	"github.com/shardpilot/shardpilot/pkg/store"
)

// analyze prints what the ingesters rejected, and the fields they applied
// without (warnings): each source's problems, as its leader reports them.
func analyze(ctx context.Context, o *options, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q", args)
	}
	if len(o.files) > 0 {
		problems, err := analyzeFiles(o.files)
		if err != nil {
			return err
		}
		var rejected error
		if n := len(slices.DeleteFunc(slices.Clone(problems), func(p app.Problem) bool { return p.Warning })); n > 0 {
			rejected = fmt.Errorf("%d inputs would be rejected", n)
		}
		return printProblems(o, problems, fmt.Sprintf("No problems in %s.", strings.Join(o.files, ", ")), rejected)
	}
	ms, err := o.find(ctx, "ingester")
	if err != nil {
		return err
	}
	var mu sync.Mutex
	problems := []app.Problem{}
	askErr := askEach(ctx, o, ms, func(ctx context.Context, _ int, m store.Member) error {
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
	return printProblems(o, problems, fmt.Sprintf("No rejected objects (%d ingesters asked).", len(ms)), askErr)
}

// printProblems prints the problems (none: the line none says), and
// returns askErr once they are printed.
func printProblems(o *options, problems []app.Problem, none string, askErr error) error {
	if o.output != "table" {
		return cmp.Or(writeOutput(o, problems), askErr)
	}
	if len(problems) == 0 {
		fmt.Fprintln(o.stdout, none)
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

// analyzeFiles reads YAML files and directories as an ingester's YAML
// directory source reads them, and returns what it would reject or warn of,
// without a cluster or a store: the Istio and registry resources, checked
// and normalized alike. Resources that name each other across the files
// given are checked together.
func analyzeFiles(paths []string) ([]app.Problem, error) {
	dir, err := os.MkdirTemp("", "shardctl-analyze-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	// One directory of copies, so that the files are read as one mesh.
	for i, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("-f %s: %w", p, err)
		}
		to := filepath.Join(dir, fmt.Sprintf("%d-%s", i, filepath.Base(p)))
		if st.IsDir() {
			err = os.CopyFS(to, os.DirFS(p))
		} else {
			var b []byte
			if b, err = os.ReadFile(p); err == nil {
				err = os.WriteFile(to, b, 0o600)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("-f %s: %w", p, err)
		}
	}
	inputs, problems, err := yamldir.Read(dir, time.Now())
	if err != nil {
		return nil, err
	}
	objs, more := istio.Normalize(inputs, istio.Options{})
	out := []app.Problem{}
	for _, p := range ingest.Check("yaml", objs, append(problems, more...)) {
		// The copies' names stand for the paths given.
		loc := p.Location
		for i, given := range paths {
			prefix := fmt.Sprintf("%d-%s", i, filepath.Base(given))
			if rest, ok := strings.CutPrefix(loc, prefix); ok {
				loc = given + rest
			}
		}
		out = append(out, app.Problem{Source: "file", Location: loc, Resource: p.Resource, Field: p.Field, Reason: p.Reason, Warning: p.Warning})
	}
	slices.SortFunc(out, func(a, b app.Problem) int {
		return cmp.Or(cmp.Compare(a.Location, b.Location), cmp.Compare(a.Field, b.Field))
	})
	return out, nil
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
