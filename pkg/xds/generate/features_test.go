package generate

import "testing"

func TestGRPCCodeNames(t *testing.T) {
	for name, want := range map[string]uint32{"OK": 0, "DEADLINE_EXCEEDED": 4, "UNAVAILABLE": 14, "UNAUTHENTICATED": 16} {
		if got, ok := grpcCodes[name]; !ok || got != want {
			t.Errorf("%s: %d (%v), want %d", name, got, ok, want)
		}
	}
}
