package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sinewmq/sinew/internal/benchkit"
)

// record is one cell run against one broker: the raw material of the report.
type record struct {
	Broker       string           `json:"broker"`
	Cell         string           `json:"cell"`
	Run          int              `json:"run"`
	IdleRSSBytes uint64           `json:"idle_rss_bytes,omitempty"` // broker RSS after start-up, before any client
	Result       *benchkit.Result `json:"result,omitempty"`
	Error        string           `json:"error,omitempty"`
}

// resultsFile is what a comparison run writes (results.json) and what -report
// renders again.
type resultsFile struct {
	Started  time.Time         `json:"started"`
	Finished time.Time         `json:"finished"`
	Brokers  []string          `json:"brokers"`
	Versions map[string]string `json:"versions"`
	Settings map[string]string `json:"settings"`
	Records  []record          `json:"records"`
}

// metric is one row of the table and one panel of the chart.
type metric struct {
	title        string
	unit         string
	higherBetter bool
	cell         string
	value        func(r record) (float64, bool)
	goal         string
	goalMet      func(sinew float64, med map[string]float64) bool // nil = no goal
	goalLine     float64                                          // drawn on the chart when > 0
}

func resultValue(f func(*benchkit.Result) (float64, bool)) func(record) (float64, bool) {
	return func(r record) (float64, bool) {
		if r.Result == nil {
			return 0, false
		}
		return f(r.Result)
	}
}

func rate(r *benchkit.Result) (float64, bool) { return r.MsgPerSec, r.Seconds > 0 }

func p99(r *benchkit.Result) (float64, bool) {
	if r.Latency == nil || r.Latency.Count == 0 {
		return 0, false
	}
	return float64(r.Latency.P99), true
}

func mibOf(b uint64) (float64, bool) { return float64(b) / (1 << 20), b > 0 }

var metrics = []metric{
	{
		title: "Confirmed publish, 1 in flight", unit: "msg/s", higherBetter: true, cell: "publish-w1",
		value: resultValue(rate), goal: "≥ 6,000", goalLine: 6000,
		goalMet: func(s float64, _ map[string]float64) bool { return s >= 6000 },
	},
	{
		title: "Confirmed publish, 64 in flight", unit: "msg/s", higherBetter: true, cell: "publish-w64",
		value: resultValue(rate), goal: "≥ 100,000 and ≥ 1.5× nats-js", goalLine: 100000,
		goalMet: func(s float64, m map[string]float64) bool {
			n, ok := m["nats-js"]
			return s >= 100000 && (!ok || s >= 1.5*n)
		},
	},
	{
		title: "Publish→confirm p99, 1 in flight", unit: "ms", cell: "publish-w1",
		value: resultValue(p99),
	},
	{
		title: "Confirmed publish, 256 in flight (drain's prefill)", unit: "msg/s", higherBetter: true, cell: "drain",
		value: resultValue(func(r *benchkit.Result) (float64, bool) {
			if r.Prefill == nil || r.Prefill.Seconds == 0 {
				return 0, false
			}
			return r.Prefill.MsgPerSec, true
		}),
	},
	{
		title: "Drain, prefetch 256", unit: "msg/s", higherBetter: true, cell: "drain",
		value: resultValue(rate), goal: "≥ 150,000", goalLine: 150000,
		goalMet: func(s float64, _ map[string]float64) bool { return s >= 150000 },
	},
	{
		title: "Mixed {rate} msg/s: p99 due→delivery", unit: "ms", cell: "mixed",
		value: resultValue(p99), goal: "≤ 5 ms", goalLine: 5,
		goalMet: func(s float64, _ map[string]float64) bool { return s <= 5 },
	},
	{
		title: "Mixed {rate} msg/s: delivered", unit: "msg/s", higherBetter: true, cell: "mixed",
		value: resultValue(rate),
	},
	{
		title: "RSS idle", unit: "MiB", cell: "*",
		value: func(r record) (float64, bool) { return mibOf(r.IdleRSSBytes) }, goal: "≤ 15 MiB", goalLine: 15,
		goalMet: func(s float64, _ map[string]float64) bool { return s <= 15 },
	},
	{
		title: "RSS with {backlog} × 1 KiB backlog", unit: "MiB", cell: "drain",
		value: resultValue(func(r *benchkit.Result) (float64, bool) {
			if r.Proc == nil {
				return 0, false
			}
			return mibOf(r.Proc.RSSBacklogBytes)
		}),
		goal:     "≤ 100 MiB",
		goalMet:  func(s float64, _ map[string]float64) bool { return s <= 100 },
		goalLine: 100,
	},
}

// titleOf fills the run's settings into a metric's title.
func titleOf(m metric, f *resultsFile) string {
	short := func(key string) string {
		var n int
		if _, err := fmt.Sscan(f.Settings[key], &n); err != nil || n <= 0 {
			return "?"
		}
		if n%1000 == 0 {
			return fmt.Sprintf("%dk", n/1000)
		}
		return fmt.Sprint(n)
	}
	return strings.NewReplacer("{rate}", short("rate"), "{backlog}", short("backlog")).Replace(m.title)
}

// stat is the median of a metric's runs for one broker, with the range and the
// number of runs that produced no value.
type stat struct {
	med, lo, hi float64
	n, failed   int
}

func summarize(f *resultsFile, m metric, broker string) stat {
	var vals []float64
	failed := 0
	for _, r := range f.Records {
		if r.Broker != broker || (m.cell != "*" && r.Cell != m.cell) {
			continue
		}
		if v, ok := m.value(r); ok {
			vals = append(vals, v)
		} else if m.cell != "*" {
			failed++
		}
	}
	s := stat{n: len(vals), failed: failed}
	if len(vals) == 0 {
		return s
	}
	slices.Sort(vals)
	s.lo, s.hi = vals[0], vals[len(vals)-1]
	if len(vals)%2 == 1 {
		s.med = vals[len(vals)/2]
	} else {
		s.med = (vals[len(vals)/2-1] + vals[len(vals)/2]) / 2
	}
	return s
}

// fmtNum prints v with a precision that suits its size.
func fmtNum(v float64) string {
	switch {
	case v >= 999.5:
		return groupThousands(int64(math.Round(v)))
	case v >= 99.95:
		return fmt.Sprintf("%.0f", v)
	case v >= 9.995:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func groupThousands(n int64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// writeMarkdown renders the comparison table. A ratio column per peer says how
// many times better Sinew is (above 1) or worse (below 1), whichever direction
// the metric counts as better.
func writeMarkdown(w io.Writer, f *resultsFile) error {
	var b strings.Builder
	peers := slices.DeleteFunc(slices.Clone(f.Brokers), func(s string) bool { return s == "sinew" })
	hasSinew := slices.Contains(f.Brokers, "sinew")
	b.WriteString("| Workload (1 KiB messages) | Unit |")
	for _, br := range f.Brokers {
		fmt.Fprintf(&b, " %s |", br)
	}
	if hasSinew {
		for _, p := range peers {
			fmt.Fprintf(&b, " Sinew vs %s |", p)
		}
		b.WriteString(" Goal | Met |")
	}
	b.WriteString("\n|---|---|")
	for range f.Brokers {
		b.WriteString("---:|")
	}
	if hasSinew {
		for range peers {
			b.WriteString("---:|")
		}
		b.WriteString("---|---|")
	}
	b.WriteString("\n")
	for _, m := range metrics {
		meds := map[string]float64{}
		stats := map[string]stat{}
		for _, br := range f.Brokers {
			s := summarize(f, m, br)
			stats[br] = s
			if s.n > 0 {
				meds[br] = s.med
			}
		}
		dir := "higher is better"
		if !m.higherBetter {
			dir = "lower is better"
		}
		fmt.Fprintf(&b, "| %s | %s, %s |", titleOf(m, f), m.unit, dir)
		for _, br := range f.Brokers {
			s := stats[br]
			var v string
			switch {
			case s.n == 0:
				v = "n/a"
			case s.n == 1:
				v = fmtNum(s.med)
			default:
				v = fmt.Sprintf("%s <sub>(%s–%s)</sub>", fmtNum(s.med), fmtNum(s.lo), fmtNum(s.hi))
			}
			if s.failed > 0 {
				v += fmt.Sprintf(" ⚠%d", s.failed) // runs without a value: see the notes
			}
			fmt.Fprintf(&b, " %s |", v)
		}
		if !hasSinew {
			b.WriteString("\n")
			continue
		}
		sv, sok := meds["sinew"]
		for _, p := range peers {
			pv, pok := meds[p]
			if !sok || !pok || sv == 0 || pv == 0 {
				b.WriteString(" – |")
				continue
			}
			ratio := sv / pv
			if !m.higherBetter {
				ratio = pv / sv
			}
			fmt.Fprintf(&b, " %.2f× |", ratio)
		}
		goal, met := m.goal, ""
		if goal == "" {
			goal = "–"
		} else if sok && m.goalMet != nil {
			met = "no"
			if m.goalMet(sv, meds) {
				met = "yes"
			}
		}
		fmt.Fprintf(&b, " %s | %s |\n", goal, met)
	}
	b.WriteString("\nEach value is the median of the runs, with the lowest and highest in brackets. ")
	b.WriteString("“Sinew vs X” is how many times better Sinew is than X (above 1: Sinew better; below 1: worse), ")
	b.WriteString("taking into account whether higher or lower is better. ⚠N marks N runs that produced no value; their errors follow.\n")
	if s := f.Settings["skipped"]; s != "" {
		fmt.Fprintf(&b, "\nNot run (broker:workload): %s.\n", strings.ReplaceAll(s, ",", ", "))
	}
	var notes []string
	for _, r := range f.Records {
		if r.Error != "" {
			notes = append(notes, fmt.Sprintf("- %s, %s, run %d: %s", r.Broker, r.Cell, r.Run, oneLine(r.Error)))
		}
	}
	if len(notes) > 0 {
		b.WriteString("\nRuns that ended with an error:\n\n" + strings.Join(notes, "\n") + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// Chart layout, in SVG user units.
const (
	svgPanelW   = 440
	svgPanelH   = 40 + 26*4 + 16
	svgCols     = 2
	svgLabelW   = 110
	svgBarH     = 18
	svgBarGap   = 8
	svgMarginPx = 10
)

var brokerColors = map[string]string{
	"sinew":        "#d9480f",
	"nats-js":      "#1c7ed6",
	"nats-js-sync": "#4dabf7",
	"rabbitmq":     "#868e96",
}

func colorOf(broker string, i int) string {
	if c, ok := brokerColors[broker]; ok {
		return c
	}
	palette := []string{"#2f9e44", "#ae3ec9", "#f59f00", "#495057"}
	return palette[i%len(palette)]
}

// writeSVG draws one small horizontal bar chart per metric, medians only, each
// panel scaled to its own largest value.
func writeSVG(w io.Writer, f *resultsFile) error {
	rows := (len(metrics) + svgCols - 1) / svgCols
	barsH := len(f.Brokers) * (svgBarH + svgBarGap)
	panelH := 40 + barsH + 20
	width := svgCols*svgPanelW + 2*svgMarginPx
	height := rows*panelH + 2*svgMarginPx + 24
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="14" font-weight="bold">Sinew and peers, 1 KiB messages, median of runs (arrows: which way is better)</text>`+"\n", svgMarginPx, svgMarginPx+14)
	for i, m := range metrics {
		x0 := svgMarginPx + (i%svgCols)*svgPanelW
		y0 := svgMarginPx + 24 + (i/svgCols)*panelH
		arrow := "↑"
		if !m.higherBetter {
			arrow = "↓"
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">%s (%s %s)</text>`+"\n", x0, y0+20, html.EscapeString(titleOf(m, f)), html.EscapeString(m.unit), arrow)
		maxV := 0.0
		meds := make([]stat, len(f.Brokers))
		for j, br := range f.Brokers {
			meds[j] = summarize(f, m, br)
			if meds[j].n > 0 {
				maxV = math.Max(maxV, meds[j].med)
			}
		}
		if maxV > 0 && m.goalLine > 0 {
			maxV = math.Max(maxV, m.goalLine)
		}
		barMaxW := float64(svgPanelW - svgLabelW - 90)
		for j, br := range f.Brokers {
			y := y0 + 32 + j*(svgBarH+svgBarGap)
			fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", x0, y+13, html.EscapeString(br))
			s := meds[j]
			if s.n == 0 {
				fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#868e96">n/a</text>`+"\n", x0+svgLabelW, y+13)
				continue
			}
			bw := 1.0
			if maxV > 0 {
				bw = math.Max(1, barMaxW*s.med/maxV)
			}
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x0+svgLabelW, y, bw, svgBarH, colorOf(br, j))
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s</text>`+"\n", float64(x0+svgLabelW)+bw+6, y+13, fmtNum(s.med))
		}
		if maxV > 0 && m.goalLine > 0 {
			// Sinew's goal as a dashed line across the bars.
			gx := float64(x0+svgLabelW) + barMaxW*m.goalLine/maxV
			top, bottom := y0+28, y0+32+len(f.Brokers)*(svgBarH+svgBarGap)-svgBarGap+4
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#000" stroke-dasharray="4 3"/>`+"\n", gx, top, gx, bottom)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10" text-anchor="middle">Sinew goal</text>`+"\n", gx, bottom+11)
		}
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
