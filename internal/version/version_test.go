package version

import (
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestBuildInfo: the build-info metric names the release, the revision and
// the Go that built the binary, and the printed version says the same.
func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector())
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "shardpilot_build_info" {
		t.Fatalf("gathered %v, %v", mfs, err)
	}
	m := mfs[0].GetMetric()[0]
	got := map[string]string{}
	for _, l := range m.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	if got["version"] != Release || got["revision"] != Revision() || got["goversion"] != runtime.Version() || m.GetGauge().GetValue() != 1 {
		t.Errorf("shardpilot_build_info %v = %v", got, m.GetGauge().GetValue())
	}
	if s := String(); !strings.HasPrefix(s, "shardpilot "+Release+" (revision "+Revision()+", "+runtime.Version()) {
		t.Errorf("version %q", s)
	}
}
