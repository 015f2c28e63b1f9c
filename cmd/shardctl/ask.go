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
	u := url.URL{Scheme: "http", Host: m.Admin, Path: path}
	if m.AdminTLS != "" {
		u.Scheme, u.Host = "https", m.AdminTLS
	}
	if p, q, ok := strings.Cut(path, "?"); ok {
		u.Path, u.RawQuery = p, q
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
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
			return fmt.Errorf("its admin port %s is announced without TLS: the token is not sent in the clear (give the pushers and ingesters --admin-tls-addr, or reach it through a port-forward with --admin-addrs)", m.Admin)
		}
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := o.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if resp.StatusCode == http.StatusNotFound && o.admin != "" {
			return errNotServed
		}
		if resp.StatusCode == http.StatusUnauthorized && token == "" && o.kube != nil && o.kube.tokenError() != nil {
			return fmt.Errorf("%s: %s (%v; give --admin-token-file)", path, resp.Status, o.kube.tokenError())
		}
		return fmt.Errorf("%s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// askEach calls ask for every member at once. It reports on stderr each
// member that could not be asked, and returns an error counting them
// after every member has answered or failed.
func askEach(ctx context.Context, o *options, ms []store.Member, ask func(context.Context, store.Member) error) error {
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, m := range ms {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = ask(ctx, m)
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
	if o.output != "table" {
		return writeOutput(o, ms)
	}
	t := newTable(o.stdout, "NAME", "ROLE", "ADMIN", "ADS", "AGE", "VERSION")
	for _, m := range ms {
		t.row(m.Name, m.Role, m.Admin, m.ADS, age(m.Started), m.Version)
	}
	return t.flush()
}

// versions prints shardctl's version and, when etcd answers, every
// member's.
func versions(ctx context.Context, o *options, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q", args)
	}
	var ms []store.Member
	err := errors.New("the members' versions are what etcd holds: drop --admin-addrs")
	if o.admin == "" {
		ms, err = o.find(ctx, "")
	}
	if o.output == "json" {
		out := map[string]any{"client": version.String()}
		if err == nil {
			out["members"] = ms
		}
		if werr := writeOutput(o, out); werr != nil {
			return werr
		}
		return err
	}
	fmt.Fprintf(o.stdout, "client: %s\n", version.String())
	if err != nil {
		return err
	}
	t := newTable(o.stdout, "NAME", "ROLE", "VERSION")
	for _, m := range ms {
		t.row(m.Name, m.Role, cmp.Or(m.Version, "(not announced)"))
	}
	return t.flush()
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
