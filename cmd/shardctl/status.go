package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
)

// proxyRow is one proxy in proxy-status.
type proxyRow struct {
	Proxy  string `json:"proxy"`
	Pusher string `json:"pusher"`
	// Admin is the pusher's admin address.
	Admin     string    `json:"pusher_admin"`
	Class     string    `json:"class,omitempty"`
	API       string    `json:"api"`
	Connected time.Time `json:"connected"`
	// Streams counts the proxy's open streams across every pusher (more
	// than one while it moves between pushers); the row is its newest.
	Streams int                  `json:"streams"`
	Types   map[string]typeState `json:"types"`
}

// typeState is where one type stands for one proxy.
type typeState struct {
	State     string       `json:"state"`
	Sent      string       `json:"sent,omitempty"`
	Acked     string       `json:"acked,omitempty"`
	Resources int          `json:"resources"`
	LastNACK  *server.NACK `json:"last_nack,omitempty"`
}

// typeNames are the xDS names of the types /debug/syncz reports by message name.
var typeNames = map[string]string{
	"Cluster": "CDS", "Listener": "LDS", "ClusterLoadAssignment": "EDS", "RouteConfiguration": "RDS",
	"Secret": "SDS", "ScopedRouteConfiguration": "SRDS", "Runtime": "RTDS", "TypedExtensionConfig": "ECDS",
}

// typeOrder orders the type columns: CDS, LDS, EDS, RDS first, as istioctl.
func typeOrder(a, b string) int {
	rank := func(t string) int {
		if i := slices.Index([]string{"CDS", "LDS", "EDS", "RDS"}, t); i >= 0 {
			return i
		}
		return 4
	}
	return cmp.Or(cmp.Compare(rank(a), rank(b)), cmp.Compare(a, b))
}

// streams asks every pusher for its streams (of one proxy, when given).
func streams(ctx context.Context, o *options, proxy string) ([]proxyRow, error) {
	ms, err := o.find(ctx, "pusher")
	if err != nil {
		return nil, err
	}
	path := "/debug/syncz"
	if proxy != "" {
		path += "?proxy=" + url.QueryEscape(proxy)
	}
	var mu sync.Mutex
	var rows []proxyRow
	err = askEach(ctx, o, ms, func(ctx context.Context, _ int, m store.Member) error {
		var got []server.StreamStatus
		if err := o.get(ctx, m, path, &got); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, st := range got {
			rows = append(rows, row(m, st))
		}
		return nil
	})
	return once(rows), err
}

func row(m store.Member, st server.StreamStatus) proxyRow {
	r := proxyRow{Proxy: st.Proxy, Pusher: m.Name, Admin: m.Admin, Class: string(st.Class), API: "SotW", Connected: st.Since,
		Types: make(map[string]typeState, len(st.Types))}
	if st.Delta {
		r.API = "Delta"
	}
	for short, ts := range st.Types {
		name := typeNames[short]
		if name == "" {
			name = short
		}
		r.Types[name] = typeState{State: ts.State(), Sent: ts.Sent, Acked: ts.Acked, Resources: ts.Resources, LastNACK: ts.LastNACK}
	}
	return r
}

// once keeps each proxy's newest stream, counting its streams, ordered by
// proxy.
func once(rows []proxyRow) []proxyRow {
	byProxy := map[string]proxyRow{}
	count := map[string]int{}
	for _, r := range rows {
		count[r.Proxy]++
		if cur, ok := byProxy[r.Proxy]; !ok || r.Connected.After(cur.Connected) {
			byProxy[r.Proxy] = r
		}
	}
	out := make([]proxyRow, 0, len(byProxy))
	for _, p := range slices.Sorted(maps.Keys(byProxy)) {
		r := byProxy[p]
		r.Streams = count[p]
		out = append(out, r)
	}
	return out
}

// proxyStatus prints every proxy once, or one proxy in detail.
func proxyStatus(ctx context.Context, o *options, args []string) error {
	if len(args) > 1 {
		return fmt.Errorf("want at most one proxy, got %q", args)
	}
	proxy := ""
	var rows []proxyRow
	var askErr error
	if len(args) == 1 {
		proxy = args[0]
		rows, askErr = resolve(ctx, o, proxy)
	} else {
		rows, askErr = streams(ctx, o, "")
		if o.namespace != "" {
			rows = slices.DeleteFunc(rows, func(r proxyRow) bool { return proxyNamespace(r.Proxy) != o.namespace })
		}
	}
	if len(rows) == 0 && askErr != nil {
		return askErr // not "no proxies": the pushers could not be asked
	}
	if proxy != "" && len(rows) == 0 {
		return fmt.Errorf("proxy %q is connected to no pusher", proxy)
	}
	var err error
	switch {
	case o.output != "table":
		err = writeOutput(o, rows)
	case proxy != "":
		err = detail(o, rows[0])
	default:
		err = overview(o, rows)
	}
	return cmp.Or(err, askErr)
}

func overview(o *options, rows []proxyRow) error {
	if len(rows) == 0 {
		if o.namespace != "" {
			fmt.Fprintf(o.stdout, "No proxy of namespace %s is connected.\n", o.namespace)
			return nil
		}
		fmt.Fprintln(o.stdout, "No proxies are connected.")
		return nil
	}
	types := map[string]bool{"CDS": true, "LDS": true, "EDS": true, "RDS": true}
	for _, r := range rows {
		for t := range r.Types {
			types[t] = true
		}
	}
	cols := slices.SortedFunc(maps.Keys(types), typeOrder)
	t := newTable(o.stdout, append(append([]string{"NAME", "PUSHER"}, cols...), "API", "CLASS", "AGE")...)
	for _, r := range rows {
		cells := []string{shortName(r.Proxy), r.Pusher}
		for _, c := range cols {
			cells = append(cells, r.Types[c].State)
		}
		t.row(append(cells, r.API, r.Class, age(r.Connected))...)
	}
	return t.flush()
}

func detail(o *options, r proxyRow) error {
	t := newTable(o.stdout, "PROXY", r.Proxy)
	t.row("PUSHER", fmt.Sprintf("%s (%s)", r.Pusher, r.Admin))
	t.row("API", r.API)
	t.row("CLASS", r.Class)
	t.row("CONNECTED", since(r.Connected))
	t.row("STREAMS", fmt.Sprint(r.Streams))
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(o.stdout)
	t = newTable(o.stdout, "TYPE", "STATE", "SENT", "ACKED", "RESOURCES", "LAST NACK")
	for _, name := range slices.SortedFunc(maps.Keys(r.Types), typeOrder) {
		ts := r.Types[name]
		nack := ""
		if n := ts.LastNACK; n != nil {
			nack = fmt.Sprintf("%s: %s (%s)", n.Version, n.Message, since(n.At))
		}
		t.row(name, ts.State, ts.Sent, ts.Acked, fmt.Sprint(ts.Resources), nack)
	}
	return t.flush()
}

// pusherOf is the pusher a row's stream is on.
func pusherOf(r proxyRow) store.Member {
	return store.Member{Role: "pusher", Name: r.Pusher, Admin: r.Admin}
}
