package cluster

import "testing"

func TestParseMetrics(t *testing.T) {
	got := parseMetrics(`# HELP x y
container_memory_rss{container="",id="/kubepods/pod1",namespace="shardpilot",pod="p-0"} 1.0555392e+07 1795740810371
shardpilot_pusher_stale_seconds 3
odd{a="x\"y,z",b="2"} 4
`)
	if len(got) != 3 {
		t.Fatalf("%d samples, want 3: %+v", len(got), got)
	}
	if got[0].name != "container_memory_rss" || got[0].labels["pod"] != "p-0" || got[0].labels["container"] != "" || got[0].value != 10555392 {
		t.Errorf("first: %+v", got[0])
	}
	if got[1].name != "shardpilot_pusher_stale_seconds" || got[1].value != 3 {
		t.Errorf("second: %+v", got[1])
	}
	if got[2].labels["a"] != `x"y,z` || got[2].labels["b"] != "2" || got[2].value != 4 {
		t.Errorf("third: %+v", got[2])
	}
	if s := sum(got, "odd", map[string]string{"b": "2"}); s != 4 {
		t.Errorf("sum = %v, want 4", s)
	}
}
