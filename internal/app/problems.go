package app

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"

	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/telemetry/statuspage"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
)

// Problem is one rejected input, as /debug/problems serves it.
type Problem struct {
	Source   string `json:"source"`
	Location string `json:"location"`
	Resource string `json:"resource,omitempty"`
	Field    string `json:"field,omitempty"`
	Reason   string `json:"reason"`
	// Warning says the object applies all the same (a field that has no
	// effect yet); otherwise it is rejected.
	Warning bool `json:"warning,omitempty"`
}

// Problems lists the current problems of the sources this process syncs,
// ordered by source and location.
func Problems(m *ingest.Report) []Problem {
	out := []Problem{}
	for source, problems := range m.Problems() {
		for _, p := range problems {
			out = append(out, Problem{Source: source, Location: p.Location, Resource: p.Resource, Field: p.Field, Reason: p.Reason, Warning: p.Warning})
		}
	}
	slices.SortFunc(out, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Source, b.Source), cmp.Compare(a.Location, b.Location), cmp.Compare(a.Resource, b.Resource))
	})
	return out
}

// ProblemsHandler serves /debug/problems: the current problems as JSON.
func ProblemsHandler(m *ingest.Report) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(Problems(m))
	})
}

// Rejections lists the sources' current problems for the status page.
func Rejections(m *ingest.Report) func() []statuspage.Rejected {
	return func() []statuspage.Rejected {
		var out []statuspage.Rejected
		for _, p := range Problems(m) {
			where, why := p.Location, p.Reason
			if p.Resource != "" {
				where += " (" + p.Resource + ")"
			}
			if p.Field != "" {
				why = p.Field + ": " + why
			}
			if p.Warning {
				why = "warning (applied): " + why
			}
			out = append(out, statuspage.Rejected{Source: p.Source, Location: where, Reason: why})
		}
		return out
	}
}

// PageStreams lists the proxies' streams for the status page.
func PageStreams(s *server.Streams) func() []statuspage.Stream {
	return func() []statuspage.Stream {
		all := s.Status()
		out := make([]statuspage.Stream, 0, len(all))
		for _, st := range all {
			ps := statuspage.Stream{Proxy: st.Proxy, Class: string(st.Class), Delta: st.Delta, Since: st.Since, Types: make(map[string]statuspage.TypeState, len(st.Types))}
			for t, ts := range st.Types {
				state := statuspage.TypeState{State: ts.State()}
				if ts.LastNACK != nil {
					state.LastNACK = ts.LastNACK.Message
				}
				ps.Types[t] = state
			}
			out = append(out, ps)
		}
		return out
	}
}
