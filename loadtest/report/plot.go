package report

import (
	"fmt"
	"image/color"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
}

// plot draws the convergence CDF, convergence over time, and the serving
// processes' CPU and RSS over time, one series per phase.
func (r *Report) plot(dir string) error {
	cdf := newPlot("Convergence of each change (CDF)", "seconds from the change to its last proxy's ACK", "share of changes")
	over := newPlot("Convergence over time", "seconds since the changes began", "convergence (s)")
	cpu := newPlot("Control plane CPU", "seconds since the phase began", "CPU seconds used")
	rss := newPlot("Control plane resident memory", "seconds since the phase began", "RSS (MiB)")
	cdf.Legend.Top, cdf.Legend.Left = false, false // bottom right, below the curves
	for i, p := range r.Phases {
		c := palette[i%len(palette)]
		var conv []float64
		var pts plotter.XYs
		for _, pt := range p.Timeline {
			conv = append(conv, pt.Convergence)
			pts = append(pts, plotter.XY{X: pt.At, Y: pt.Convergence})
		}
		slices.Sort(conv)
		var cdfPts plotter.XYs
		for j, v := range conv {
			cdfPts = append(cdfPts, plotter.XY{X: v, Y: float64(j+1) / float64(len(conv))})
		}
		if err := addLine(cdf, p.Name, c, cdfPts); err != nil {
			return err
		}
		if len(pts) > 0 {
			s, err := plotter.NewScatter(pts)
			if err != nil {
				return fmt.Errorf("report: plot: %w", err)
			}
			s.Color = c
			s.Radius = vg.Points(1.5)
			over.Add(s)
			over.Legend.Add(p.Name, s)
		}
		var cpuPts, rssPts plotter.XYs
		for _, u := range p.Usage {
			cpuPts = append(cpuPts, plotter.XY{X: u.At, Y: u.CPU})
			rssPts = append(rssPts, plotter.XY{X: u.At, Y: u.RSS})
		}
		if err := addLine(cpu, p.Name, c, cpuPts); err != nil {
			return err
		}
		if err := addLine(rss, p.Name, c, rssPts); err != nil {
			return err
		}
	}
	for name, pl := range map[string]*plot.Plot{"convergence-cdf.png": cdf, "convergence-time.png": over, "cpu.png": cpu, "rss.png": rss} {
		if err := pl.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("report: plot %s: %w", name, err)
		}
	}
	return nil
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	return p
}

func addLine(p *plot.Plot, name string, c color.Color, pts plotter.XYs) error {
	if len(pts) == 0 {
		return nil
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return fmt.Errorf("report: plot: %w", err)
	}
	l.Color = c
	l.Width = vg.Points(1.5)
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}
