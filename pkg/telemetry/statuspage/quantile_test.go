package statuspage

import (
	"math"
	"testing"
)

// Quantiles are interpolated within their bucket, as histogram_quantile
// does.
func TestQuantile(t *testing.T) {
	bs := []bucket{{0.1, 10}, {0.2, 60}, {0.4, 100}, {math.Inf(1), 100}}
	for _, c := range []struct{ q, want float64 }{{0.1, 0.1}, {0.5, 0.18}, {0.99, 0.395}} {
		if got := quantile(c.q, bs); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("q%.2f = %v, want %v", c.q, got, c.want)
		}
	}
	if got := quantile(0.5, []bucket{{0.1, 0}, {math.Inf(1), 0}}); !math.IsNaN(got) {
		t.Errorf("no observations: %v, want NaN", got)
	}
}
