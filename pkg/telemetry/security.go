package telemetry

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// Severities of a Weakness.
const (
	// High: a client without a credential, or one credential, can change
	// or read what docs/security.md's deployment keeps from it.
	High = "high"
	// Medium: one step from it (a secret in the clear, a guard that a
	// port-forward passes).
	Medium = "medium"
)

// Weakness is a setting of a running part that leaves it more open than the
// deployment docs/security.md describes: the setting that closes it, and
// what it costs while open.
type Weakness struct {
	Severity string `json:"severity"`
	Setting  string `json:"setting"`
	Risk     string `json:"risk"`
}

// WeaknessHandler answers /debug/security with what weaknesses returns
// (JSON, an empty list when there are none); weaknesses may ask the
// servers the part reaches, within a few seconds.
func WeaknessHandler(weaknesses func(context.Context) []Weakness) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		ws := weaknesses(ctx)
		if ws == nil {
			ws = []Weakness{}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(ws)
	})
}
