package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/shardpilot/shardpilot/internal/version"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
	"sigs.k8s.io/yaml"
)

// errNotServed is an admin port's 404: it is not of the role asked (with
// --admin-addrs, every address is asked for every role).
var errNotServed = errors.New("not served here")

// errNoPage is an announced member's 404: the page is not one its role
// serves.
var errNoPage = errors.New("no such page on this member")

// find returns the members of a role: those announced in etcd, or one per
// --admin-addrs address.
func (o *options) find(ctx context.Context, role string) ([]store.Member, error) {
	if o.kube != nil {
		return o.kube.find(ctx, role)
	}
	if o.admin != "" {
		var out []store.Member
		for _, a := range strings.Split(o.admin, ",") {
			if a = strings.TrimSpace(a); a != "" {
				m := store.Member{Role: role, Name: a, Admin: a}
				if o.caFile != "" {
					m.AdminTLS = a
				}
				out = append(out, m)
			}
		}
		return out, nil
	}
	cfg, err := o.etcd.Config(o.timeout)
	if err != nil {
		return nil, err
	}
	etcd, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", o.etcd.Endpoints, err)
	}
	defer etcd.Close()
	ms, err := store.Members(ctx, etcd, role)
	if errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("etcd %s did not answer in %s: give --etcd-endpoints, or find the pushers and ingesters in Kubernetes with --kube-namespace <the release's namespace>: %w", o.etcd.Endpoints, o.timeout, err)
	}
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", o.etcd.Endpoints, err)
	}
	if len(ms) == 0 && role != "" {
		return nil, fmt.Errorf("no %s is announced in etcd at %s (are they running, against this etcd?)", role, o.etcd.Endpoints)
	}
	return ms, nil
}

// get asks one member's admin port for path and decodes its JSON answer.
func (o *options) get(ctx context.Context, m store.Member, path string, into any) error {
	return o.call(ctx, m, http.MethodGet, path, into)
}

// call sends one member's admin port a request without a body and decodes
// its JSON answer.
func (o *options) call(ctx context.Context, m store.Member, method, path string, into any) error {
	body, err := o.send(ctx, m, method, path)
	if err != nil {
		return err
	}
	defer body.Close()
	if err := json.NewDecoder(body).Decode(into); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// do asks one member's admin port for path, and returns the body of its
// answer (the caller closes it), or an error that says why there is none.
func (o *options) do(ctx context.Context, m store.Member, path string) (io.ReadCloser, error) {
	return o.send(ctx, m, http.MethodGet, path)
}

// send is do with another method than GET.
func (o *options) send(ctx context.Context, m store.Member, method, path string) (io.ReadCloser, error) {
	u := url.URL{Scheme: "http", Host: m.Admin, Path: path}
	if m.AdminTLS != "" {
		u.Scheme, u.Host = "https", m.AdminTLS
	}
	if p, q, ok := strings.Cut(path, "?"); ok {
		u.Path, u.RawQuery = p, q
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		return nil, err
	}
	token := o.token
	if token == "" && o.kube != nil {
		token = o.kube.token(u.Host) // the pod's own, from its Secret
	}
	if token != "" {
		// An address etcd announces may be anyone's (whoever can write
		// etcd can announce one): the token goes there over TLS alone.
		host, _, _ := net.SplitHostPort(u.Host)
		if u.Scheme != "https" && o.admin == "" && host != "127.0.0.1" && host != "::1" && host != "localhost" {
			return nil, fmt.Errorf("its admin port %s is announced without TLS: the token is not sent in the clear (give the pushers and ingesters --admin-tls-addr, or reach it through a port-forward with --admin-addrs)", m.Admin)
		}
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := o.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusOK {
		return resp.Body, nil
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode == http.StatusNotFound {
		if o.admin != "" {
			return nil, errNotServed
		}
		return nil, fmt.Errorf("%s: %s: %w", path, resp.Status, errNoPage)
	}
	if resp.StatusCode == http.StatusUnauthorized && token == "" && o.kube != nil && o.kube.tokenError() != nil {
		return nil, fmt.Errorf("%s: %s (%v; give --admin-token-file)", path, resp.Status, o.kube.tokenError())
	}
	return nil, fmt.Errorf("%s: %s: %s", path, resp.Status, strings.TrimSpace(string(text)))
}

// askEach calls ask for every member at once. It reports on stderr each
// member that could not be asked, and returns an error counting them
// after every member has answered or failed.
func askEach(ctx context.Context, o *options, ms []store.Member, ask func(ctx context.Context, i int, m store.Member) error) error {
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, m := range ms {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = ask(ctx, i, m)
		})
	}
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err == nil || errors.Is(err, errNotServed) {
			continue
		}
		failed++
		fmt.Fprintf(o.stderr, "warning: %s %s (%s) could not be asked: %v\n", ms[i].Role, ms[i].Name, ms[i].Admin, err)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d could not be asked; the rest is shown", failed, len(ms))
	}
	return nil
}

// members lists the announced pushers and ingesters.
func members(ctx context.Context, o *options, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q", args)
	}
	if o.admin != "" {
		return errors.New("members lists what etcd holds: drop --admin-addrs")
	}
	ms, err := o.find(ctx, "")
	if err != nil {
		return err
	}
	if o.kube != nil {
		// Pods announce no version: their metrics say it.
		_ = o.fillVersions(ctx, ms)
	}
	if o.output != "table" {
		return writeOutput(o, ms)
	}
	t := newTable(o.stdout, "NAME", "ROLE", "ADMIN", "ADS", "AGE", "VERSION")
	for _, m := range ms {
		t.row(m.Name, m.Role, m.Admin, m.ADS, age(m.Started), m.Version)
	}
	return t.flush()
}

// versions prints shardctl's version and every member's: as announced in
// etcd, or, for those found otherwise (--kube-namespace, --admin-addrs),
// as their metrics say (shardpilot_build_info).
func versions(ctx context.Context, o *options, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q", args)
	}
	ms, err := o.find(ctx, "")
	if err == nil {
		err = o.fillVersions(ctx, ms)
	}
	if o.output == "json" || o.output == "yaml" {
		out := map[string]any{"client": version.String()}
		if ms != nil {
			out["members"] = ms
		}
		if werr := writeOutput(o, out); werr != nil {
			return werr
		}
		return err
	}
	fmt.Fprintf(o.stdout, "client: %s\n", version.String())
	if ms == nil {
		return err
	}
	t := newTable(o.stdout, "NAME", "ROLE", "VERSION")
	for _, m := range ms {
		t.row(m.Name, cmp.Or(m.Role, "-"), cmp.Or(m.Version, "(unknown)"))
	}
	if ferr := t.flush(); ferr != nil {
		return ferr
	}
	return err
}

// logLevels prints the level of every member's logs, or sets it: for a
// look at one problem without a restart (until the next start, which
// takes --log-level again).
func logLevels(ctx context.Context, o *options, args []string) error {
	if len(args) > 1 {
		return fmt.Errorf("want [debug|info|warn|error], got %q", args)
	}
	method, path := http.MethodGet, "/debug/loglevel"
	if len(args) == 1 {
		switch args[0] {
		case "debug", "info", "warn", "error":
		default:
			return fmt.Errorf("%q: want debug, info, warn or error", args[0])
		}
		method, path = http.MethodPut, path+"?level="+args[0]
	}
	ms, err := o.find(ctx, "")
	if err != nil {
		return err
	}
	levels := make([]string, len(ms))
	askErr := askEach(ctx, o, ms, func(ctx context.Context, i int, m store.Member) error {
		var answer struct {
			Level string `json:"level"`
		}
		err := o.call(ctx, m, method, path, &answer)
		levels[i] = answer.Level
		return err
	})
	t := newTable(o.stdout, "NAME", "ROLE", "LEVEL")
	for i, m := range ms {
		t.row(m.Name, cmp.Or(m.Role, "-"), cmp.Or(levels[i], "?"))
	}
	if err := t.flush(); err != nil {
		return err
	}
	return askErr
}

// fillVersions asks the members that announced no version (those found
// through Kubernetes or --admin-addrs) for it, at once.
func (o *options) fillVersions(ctx context.Context, ms []store.Member) error {
	return askEach(ctx, o, ms, func(ctx context.Context, i int, m store.Member) error {
		if m.Version != "" {
			return nil
		}
		v, err := o.buildVersion(ctx, m)
		ms[i].Version = v
		return err
	})
}

// buildInfo finds the labels of shardpilot_build_info in a metrics page.
var buildInfo = regexp.MustCompile(`(?m)^shardpilot_build_info\{([^}]*)\}`)

// buildVersion asks a member's metrics which shardpilot it is, as
// version.String prints it.
func (o *options) buildVersion(ctx context.Context, m store.Member) (string, error) {
	body, err := o.do(ctx, m, "/metrics")
	if err != nil {
		return "", err
	}
	defer body.Close()
	page, err := io.ReadAll(io.LimitReader(body, 16<<20))
	if err != nil {
		return "", err
	}
	found := buildInfo.FindSubmatch(page)
	if found == nil {
		return "", errors.New("/metrics: no shardpilot_build_info")
	}
	labels := map[string]string{}
	for _, l := range regexp.MustCompile(`(\w+)="([^"]*)"`).FindAllSubmatch(found[1], -1) {
		labels[string(l[1])] = string(l[2])
	}
	return fmt.Sprintf("shardpilot %s (revision %s, %s)", labels["version"], labels["revision"], labels["goversion"]), nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeOutput writes v as --output says: JSON, or YAML (from the JSON, so
// that both name the fields alike).
func writeOutput(o *options, v any) error {
	if o.output != "yaml" {
		return writeJSON(o.stdout, v)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	y, err := yaml.JSONToYAML(b)
	if err != nil {
		return err
	}
	_, err = o.stdout.Write(y)
	return err
}

// since is how long ago t was, for a NACK.
func since(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return age(t) + " ago"
}
