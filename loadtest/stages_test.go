package main

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

func TestStageSummaries(t *testing.T) {
	text := func(counts ...int) string {
		var b strings.Builder
		b.WriteString("# HELP shardpilot_pusher_debounce_seconds x\n")
		for i, le := range []string{"0.01", "0.1", "1", "+Inf"} {
			b.WriteString(`shardpilot_pusher_debounce_seconds_bucket{le="` + le + `"} ` + strconv.Itoa(counts[i]) + "\n")
		}
		b.WriteString("shardpilot_pusher_debounce_seconds_sum 1\n")
		return b.String()
	}
	read := func(s string) []buckets {
		out := make([]buckets, len(stages))
		for i := range out {
			out[i] = buckets{}
		}
		parseBuckets(strings.NewReader(s), func(metric string, le, count float64) {
			for i, st := range stages {
				if st.metric == metric {
					out[i][le] += count
				}
			}
		})
		return out
	}
	// 10 samples before; then 100 more: 50 under 10ms, 40 to 100ms, 10 to 1s.
	got := stageSummaries(read(text(10, 10, 10, 10)), read(text(60, 100, 110, 110)))
	if len(got) != 1 || got[0].Name != "batch wait in the pusher" || got[0].N != 100 {
		t.Fatalf("stages %+v, want the batch wait's 100 new samples", got)
	}
	if math.Abs(got[0].P50-0.01) > 1e-9 || math.Abs(got[0].P99-0.91) > 1e-9 {
		t.Errorf("p50 %v p99 %v, want 0.01 and 0.91", got[0].P50, got[0].P99)
	}
}
