package statuspage

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Chart is an inline SVG line chart over the last minutes.
type Chart struct {
	ID, Title     string
	Width, Height int
	// Plot is the plotting area: left, top, right, bottom.
	Left, Top, Right, Bottom int
	Lines                    []Line
	YTicks, XTicks           []Tick
	Empty                    bool
}

// Line is one series: its polylines (a gap where it has no value).
type Line struct {
	Name, Class string
	Segments    []string // "x,y x,y …"
	Points      int
}

// Tick is an axis label at a coordinate.
type Tick struct {
	At    int
	Label string
}

// chart lays points out over the span before now; y from 0 to a round
// maximum.
func chart(id, title string, pts []Point, names []string, label func(float64) string, span time.Duration, least float64) Chart {
	c := Chart{ID: id, Title: title, Width: 720, Height: 220, Left: 64, Top: 12, Right: 700, Bottom: 188}
	top := least
	for _, p := range pts {
		for _, v := range p.Values {
			if !math.IsNaN(v) {
				top = max(top, v)
			}
		}
	}
	c.Empty = len(pts) == 0
	top = niceCeil(top)
	now := time.Now()
	x := func(t time.Time) float64 {
		f := 1 - now.Sub(t).Seconds()/span.Seconds()
		return float64(c.Left) + max(f, 0)*float64(c.Right-c.Left)
	}
	y := func(v float64) float64 {
		return float64(c.Bottom) - v/top*float64(c.Bottom-c.Top)
	}
	for i, name := range names {
		l := Line{Name: name, Class: fmt.Sprintf("s%d", i)}
		var seg []string
		flush := func() {
			if len(seg) > 0 {
				if len(seg) == 1 { // a lone point: a short dash
					seg = append(seg, seg[0])
				}
				l.Segments = append(l.Segments, strings.Join(seg, " "))
			}
			seg = nil
		}
		for _, p := range pts {
			v := p.Values[i]
			if math.IsNaN(v) {
				flush()
				continue
			}
			seg = append(seg, fmt.Sprintf("%.1f,%.1f", x(p.At), y(v)))
			l.Points++
		}
		flush()
		c.Lines = append(c.Lines, l)
	}
	for i := 0; i <= 4; i++ {
		v := top * float64(i) / 4
		c.YTicks = append(c.YTicks, Tick{At: int(y(v)), Label: label(v)})
	}
	for i := 5; i >= 0; i-- {
		back := span * time.Duration(i) / 5
		lbl := "now"
		if i > 0 {
			lbl = "-" + strings.TrimSuffix(strings.TrimSuffix(back.Round(time.Second).String(), "0s"), "m0")
		}
		c.XTicks = append(c.XTicks, Tick{At: int(x(now.Add(-back))), Label: lbl})
	}
	return c
}

// niceCeil rounds up to 1, 2 or 5 times a power of ten (1 when v is 0).
func niceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}
