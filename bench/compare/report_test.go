package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/internal/benchkit"
)

func cannedResults() *resultsFile {
	f := &resultsFile{
		Brokers:  []string{"sinew", "nats-js", "rabbitmq"},
		Settings: map[string]string{"rate": "20000", "backlog": "300000"},
	}
	add := func(broker, cell string, run int, rate float64, idle uint64) {
		f.Records = append(f.Records, record{
			Broker: broker, Cell: cell, Run: run, IdleRSSBytes: idle,
			Result: &benchkit.Result{Broker: broker, Messages: 1, Seconds: 1, MsgPerSec: rate,
				Latency: &benchkit.LatencySummary{Count: 1, P99: benchkit.Millis(rate / 1000)}},
		})
	}
	for run := 1; run <= 3; run++ {
		add("sinew", "publish-w64", run, 100000+float64(run)*1000, 10<<20)
		add("nats-js", "publish-w64", run, 50000, 20<<20)
		add("rabbitmq", "publish-w64", run, 25000, 140<<20)
	}
	f.Records = append(f.Records, record{Broker: "rabbitmq", Cell: "drain", Run: 1, Error: "start: boom\nsecond line"})
	return f
}

func TestMarkdownTable(t *testing.T) {
	var b bytes.Buffer
	if err := writeMarkdown(&b, cannedResults()); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"| Workload (1 KiB messages) | Unit | sinew | nats-js | rabbitmq | Sinew vs nats-js | Sinew vs rabbitmq | Goal | Met |",
		// Median 102,000 (101,000–103,000); 2.04x NATS, 4.08x RabbitMQ; the goal needs >= 1.5x nats-js too.
		"| Confirmed publish, 64 in flight | msg/s, higher is better | 102,000 <sub>(101,000–103,000)</sub> | 50,000 <sub>(50,000–50,000)</sub> | 25,000 <sub>(25,000–25,000)</sub> | 2.04× | 4.08× | ≥ 100,000 and ≥ 1.5× nats-js | yes |",
		// Lower is better for memory: NATS uses 2x Sinew's, so Sinew is 2x better.
		"| RSS idle | MiB, lower is better | 10.0 <sub>(10.0–10.0)</sub> | 20.0 <sub>(20.0–20.0)</sub> | 140 <sub>(140–140)</sub> | 2.00× | 14.00× | ≤ 15 MiB | yes |",
		"| RSS with 300k × 1 KiB backlog |",
		"| Mixed 20k msg/s: p99 due→delivery |",
		"n/a ⚠1",
		"- rabbitmq, drain, run 1: start: boom second line",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q\n%s", want, md)
		}
	}
}

func TestSVGIsWellFormed(t *testing.T) {
	var b bytes.Buffer
	if err := writeSVG(&b, cannedResults()); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(&b)
	rects := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG does not parse: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
			rects++
		}
	}
	// The background plus one bar per broker in the two panels with data:
	// publish-w64 throughput and idle RSS.
	if rects != 1+6 {
		t.Errorf("SVG has %d rects, want 7", rects)
	}
}

func TestFmtNum(t *testing.T) {
	for v, want := range map[float64]string{0.123: "0.12", 12.34: "12.3", 123.4: "123", 1234567: "1,234,567", 999.6: "1,000", 99.97: "100", 9.999: "10.0"} {
		if got := fmtNum(v); got != want {
			t.Errorf("fmtNum(%v) = %q, want %q", v, got, want)
		}
	}
}
