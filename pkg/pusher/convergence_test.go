package pusher

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestConfirmedMeasuresOnlyTheNewlyConfirmedEpochs(t *testing.T) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h"})
	var epoch atomic.Int64
	epoch.Store(1)
	p := &Pusher{conv: newConvergence(h, func() int64 { return epoch.Add(1) })}
	observed := time.Now().Add(-time.Second)
	for range 5 { // epochs 2..6
		p.conv.begin(observed)
	}
	p.conv.begin(time.Time{}) // epoch 7: a reload, nothing observed
	p.Confirmed("any", 3, 7)  // confirms 4, 5, 6 (and 7, unmeasured)
	p.Confirmed("any", 0, 1)  // before any recorded epoch
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetHistogram().GetSampleCount(); n != 3 {
		t.Errorf("%d samples, want 3", n)
	}
	if s := m.GetHistogram().GetSampleSum(); s < 3 || s > 4 {
		t.Errorf("sum %.2fs, want about 3 × 1s", s)
	}
}
