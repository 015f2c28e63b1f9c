// Package version says which shardpilot a binary is: the release, the
// source revision it was built from, and the Go that built it.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Release is shardpilot's version: the image's tag and the chart's
// appVersion are the same (make image tags it so, and a test checks the
// chart). A build may set it: -ldflags "-X
// github.com/shardpilot/shardpilot/internal/version.Release=…".
var Release = "0.1.0"

// revision is set by builds that have no VCS information for Go to record
// (an image built from a copy of the tree): -ldflags "-X
// github.com/shardpilot/shardpilot/internal/version.revision=<commit>".
var revision = ""

// Revision is the source revision the binary was built from, as Go
// records it (with "-dirty" for uncommitted changes), or as the build set
// it, or "unknown".
func Revision() string {
	if revision != "" {
		return revision
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "unknown", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
			if len(rev) > 12 {
				rev = rev[:12]
			}
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && rev != "unknown" {
		rev += "-dirty"
	}
	return rev
}

// String is the version as a command prints it.
func String() string {
	return fmt.Sprintf("shardpilot %s (revision %s, %s)", Release, Revision(), runtime.Version())
}

// Collector is the metric shardpilot_build_info{version,revision,goversion}
// (always 1), which every command exports.
func Collector() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "shardpilot_build_info",
		Help:        "Which shardpilot this is: its release, the source revision it was built from and the Go that built it (always 1).",
		ConstLabels: prometheus.Labels{"version": Release, "revision": Revision(), "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}
