package deploy_test

import (
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartTrialEtcdAuth: a trial's etcd has a user per part by default.
// The chart makes root's password and each part's, each part mounts its
// own alone, and the Job of the revision, run as rendered against a real
// etcd, makes the users and turns authentication on: a client without a
// credential is then refused, a part already signed in (the parts start
// beside the Job) keeps working as its own user with its role's rights
// alone, and the Job of the next revision runs again. Before, the trial's
// etcd took anyone: whoever reached it wrote the mesh.
func TestChartTrialEtcdAuth(t *testing.T) {
	h := helm(t)
	chart := filepath.Join("helm", "shardpilot")
	objs, err := kubetest.Decode([]byte(run(t, h, "template", "sp", chart, "--set", "trial.enabled=true")))
	if err != nil {
		t.Fatal(err)
	}
	users := find(objs, "Secret", "sp-etcd-users")
	if users == nil {
		t.Fatal("a trial makes no etcd users (sp-etcd-users)")
	}
	if keep := users.GetAnnotations()["helm.sh/resource-policy"]; keep != "" {
		t.Errorf("a trial's etcd users are kept on uninstall (%q), though its etcd goes with it", keep)
	}
	dir := t.TempDir()
	passwords := map[string]string{}
	for _, user := range []string{"root", "ingester", "pusher", "shardctl"} {
		enc, _, _ := unstructured.NestedString(users.Object, "data", user)
		b, err := base64.StdEncoding.DecodeString(enc)
		if err != nil || len(b) < 32 {
			t.Fatalf("sp-etcd-users %s: %q (%v), want a generated password", user, enc, err)
		}
		passwords[user] = string(b)
		if err := os.WriteFile(filepath.Join(dir, user), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, part := range []string{"ingester", "pusher"} {
		d := find(objs, "Deployment", "sp-"+part)
		vols, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "volumes")
		if got := secretItems(vols, "sp-etcd-users"); !slices.Equal(got, []string{part}) {
			t.Errorf("%s mounts %v of sp-etcd-users, want %s alone", part, got, part)
		}
		if env := containerEnv(d); env["SHARDPILOT_ETCD_USERNAME"] != "shardpilot-"+part || env["SHARDPILOT_ETCD_PASSWORD_FILE"] == "" {
			t.Errorf("%s signs in to the trial's etcd as %q (password file %q), want shardpilot-%s", part, env["SHARDPILOT_ETCD_USERNAME"], env["SHARDPILOT_ETCD_PASSWORD_FILE"], part)
		}
	}
	job := find(objs, "Job", "sp-etcd-roles-1")
	if job == nil {
		t.Fatal("no Job of the revision makes the trial's etcd users (sp-etcd-roles-1)")
	}
	if hook := job.GetAnnotations()["helm.sh/hook"]; hook != "" {
		t.Errorf("the trial's etcd-roles Job is a %s hook: before install there is no etcd, and helm --wait waits for the parts before post-install hooks", hook)
	}
	checkMountedFiles(t, find(objs, "Deployment", "sp-ingester"), find(objs, "Deployment", "sp-pusher"), job)

	// The parts start beside the Job: one signs in while authentication
	// is still off.
	e, open := testutil.Etcd(t)
	ctx := testutil.Context(t)
	pusher := testutil.SignIn(t, e.Endpoint, "shardpilot-pusher", passwords["pusher"])
	if _, err := pusher.Get(ctx, "/mesh/v1/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		t.Fatal(err)
	}

	// The Job, as rendered: its command and environment, its mounted
	// Secret in dir and the endpoint the test's etcd.
	shardctl := filepath.Join(t.TempDir(), "shardctl")
	run(t, "go", "build", "-o", shardctl, "../cmd/shardctl")
	runJob := func() string {
		t.Helper()
		ctr := job.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
		command, _, _ := unstructured.NestedStringSlice(ctr, "command")
		local := func(s string) string { return strings.Replace(s, "/etc/shardpilot/etcd-users", dir, 1) }
		if len(command) < 2 || command[0] != "/shardctl" {
			t.Fatalf("the Job runs %v, want /shardctl etcd-roles apply", command)
		}
		args := make([]string, 0, len(command)-1)
		for _, a := range command[1:] {
			args = append(args, local(a))
		}
		cmd := exec.Command(shardctl, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		for k, v := range containerEnv(job) {
			if k == "SHARDPILOT_ETCD_ENDPOINTS" {
				if v != "http://sp-etcd:2379" {
					t.Errorf("the Job signs in to %s, want the trial's etcd", v)
				}
				v = e.Endpoint
			}
			cmd.Env = append(cmd.Env, k+"="+local(v))
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the Job fails: %v\n%s", err, out)
		}
		return string(out)
	}
	if out := runJob(); !strings.Contains(out, "authentication: on") {
		t.Errorf("the Job did not turn authentication on:\n%s", out)
	}
	if st, err := open.AuthStatus(ctx); err != nil || !st.Enabled {
		t.Fatalf("the trial's etcd after the Job: authentication %v (%v), want on", st, err)
	}
	if _, err := open.Put(ctx, "/mesh/v1/services/x/y", "forged"); err == nil {
		t.Error("a client without a credential writes the mesh once the Job ran")
	}
	// The part signed in before keeps reading as its own user, with its
	// role's rights alone; the ingester writes.
	testutil.Eventually(t, 30*time.Second, "the pusher reads as shardpilot-pusher", func() (bool, string) {
		_, err := pusher.Get(ctx, "/mesh/v1/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil, fmt.Sprint(err)
	})
	if _, err := pusher.Put(ctx, "/mesh/v1/services/x/y", "forged"); err == nil {
		t.Error("the pusher's user writes the mesh")
	}
	if _, err := testutil.SignIn(t, e.Endpoint, "shardpilot-ingester", passwords["ingester"]).Put(ctx, "/mesh/v1/services/x/y", "{}"); err != nil {
		t.Errorf("the ingester's user writes the mesh: %v", err)
	}
	for _, r := range store.EtcdRoles() {
		if _, err := testutil.SignIn(t, e.Endpoint, r.Name, passwords[r.Part]).Get(ctx, "/mesh/v1/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
			t.Errorf("%s reads the mesh: %v", r.Name, err)
		}
	}
	// The next revision's Job, with authentication on.
	runJob()

	// Turned off: no users, no Job, no one signs in.
	objs, err = kubetest.Decode([]byte(run(t, h, "template", "sp", chart, "--set", "trial.enabled=true,trial.etcdAuth=false")))
	if err != nil {
		t.Fatal(err)
	}
	if find(objs, "Secret", "sp-etcd-users") != nil || find(objs, "Job", "sp-etcd-roles-1") != nil {
		t.Error("trial.etcdAuth=false still makes etcd users")
	}
	if env := containerEnv(find(objs, "Deployment", "sp-pusher")); env["SHARDPILOT_ETCD_USERNAME"] != "" {
		t.Errorf("trial.etcdAuth=false, the pusher still signs in to etcd as %q", env["SHARDPILOT_ETCD_USERNAME"])
	}
}
