package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/internal/cdp"
	"github.com/sinewmq/sinew/protocol"
)

// browserWaitMs bounds each wait for something to show on the page; the page
// polls every dashRefreshMs, so a few polls suffice on an idle machine, and
// the bound leaves room for a loaded one. browserTestMs bounds the whole
// test (it takes about 10 s). Reaching either is a failure.
const (
	browserWaitMs = 30_000
	browserTestMs = 120_000
	dashRefreshMs = 300
)

// binaryBody is not UTF-8: NUL, bytes that start no character, a lone
// continuation byte.
var binaryBody = []byte{0x00, 0xff, 0xfe, 'b', 'i', 'n', 0x80, 0x0a}

// artifactsDir returns where the test's screenshots and the browser's log
// go, and logs it: the test's artifact directory, kept under the output
// directory with go test -artifacts (-outputdir chooses it), else temporary.
func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := t.ArtifactDir()
	t.Logf("screenshots and the browser's log: %s", dir)
	return dir
}

// TestDashboardInBrowser loads the dashboard in headless Chromium against a
// real broker (sinew serve in-process, with its admin listener) and checks
// what an operator would: the page loads without console errors, shows a
// queue just published to with its depth, shows a session as dormant once its
// client's socket is cut, replays a dead letter from the page back onto its
// source queue (and another, binary, keeping its copy), and applies a setting changed in the form (and shows a
// concurrent change as a conflict rather than overwriting it).
func TestDashboardInBrowser(t *testing.T) {
	chromium, err := cdp.Find()
	if errors.Is(err, cdp.ErrNoBrowser) {
		t.Skip("dashboard browser test skipped: " + err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}

	cfg := testServeConfig(t)
	cfg.RuntimeSeed.Connection.ReconnectGraceMs = 120_000 // a cut session stays dormant for the whole test
	addr, adminAddr, stop := runServeAdmin(t, cfg)
	base := "http://" + adminAddr

	ctx, cancel := context.WithTimeout(context.Background(), browserTestMs*time.Millisecond)
	defer cancel()

	// A queue with a dead letter in it: declare, publish, take it and fail it.
	c, err := sinew.Dial(ctx, addr, sinew.WithClientName("dash-worker"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.DeclareQueue(ctx, "dash-work", sinew.QueueConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishText(ctx, "dash-work", "poison pill", sinew.WithKey([]byte("k-1")), sinew.WithHeader("origin", "browser-test")); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "dash-work")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-sub.Messages():
		if err := m.Fail(ctx); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("no delivery of the message to fail")
	}
	if err := sub.Unsubscribe(ctx); err != nil {
		t.Fatal(err)
	}
	// A binary dead letter, which the page must show as base64, not mangle.
	if _, err := c.Publish(ctx, "dash-bin", binaryBody); err != nil {
		t.Fatal(err)
	}
	bsub, err := c.Subscribe(ctx, "dash-bin")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-bsub.Messages():
		if err := m.Fail(ctx); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("no delivery of the binary message to fail")
	}
	if err := bsub.Unsubscribe(ctx); err != nil {
		t.Fatal(err)
	}
	// A queue with three messages waiting.
	for i := range 3 {
		if _, err := c.PublishText(ctx, "dash-orders", fmt.Sprintf("order %d", i)); err != nil {
			t.Fatal(err)
		}
	}

	dir := artifactsDir(t)
	logf, err := os.Create(filepath.Join(dir, "chromium.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	b, err := cdp.Launch(chromium, t.TempDir(), logf)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p, err := b.NewPage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	shot := func(name string) {
		t.Helper()
		if err := p.Screenshot(ctx, filepath.Join(dir, name+".png")); err != nil {
			t.Errorf("screenshot %s: %v", name, err)
		}
	}
	waitFor := func(what, cond string) {
		t.Helper()
		if err := p.WaitFor(ctx, what, cond, browserWaitMs); err != nil {
			shot("failed")
			t.Fatalf("%v\n(screenshots in %s)", err, dir)
		}
	}
	eval := func(expr string, out any) {
		t.Helper()
		if err := p.Eval(ctx, expr, out); err != nil {
			shot("failed")
			t.Fatalf("%v\n(screenshots in %s)", err, dir)
		}
	}

	if err := p.Navigate(ctx, fmt.Sprintf("%s/?refresh=%d", base, dashRefreshMs)); err != nil {
		t.Fatal(err)
	}
	// Two refreshes: the second one has rates.
	waitFor("two refreshes", `Number(document.body.dataset.refreshes) >= 2`)
	var banner bool
	eval(`document.querySelector("#banner").hidden`, &banner)
	if !banner {
		t.Errorf("the page shows its unreachable banner")
	}
	// A node that runs alone shows no nodes section.
	var nodesHidden bool
	eval(`document.querySelector("#nodes").hidden`, &nodesHidden)
	if !nodesHidden {
		t.Errorf("a node that runs alone shows a nodes section")
	}
	// The generation is a random 64-bit number: the page shows every digit
	// the broker sent, not a JS number's rounding of it.
	var ov struct {
		Generation uint64 `json:"generation"`
	}
	if code, _, body := httpGetAuth(t, base+"/api/v1/overview", ""); code != 200 {
		t.Fatalf("overview: %d %s", code, body)
	} else if err := json.Unmarshal([]byte(body), &ov); err != nil {
		t.Fatal(err)
	}
	var ident string
	eval(`document.querySelector("#ident").textContent`, &ident)
	if want := "generation " + strconv.FormatUint(ov.Generation, 10); !strings.Contains(ident, want) {
		t.Errorf("the page shows %q, want it to contain %q", ident, want)
	}

	// The queue just published to, with its depth.
	waitFor("dash-orders with depth 3", `(() => {
		const row = document.querySelector('tr.queue-row[data-topic="dash-orders"]');
		return row && row.querySelector("td.depth").dataset.depth === "3" && row.querySelector("td.ready").textContent === "3";
	})()`)
	// Its partitions open under its name, and stay open across refreshes.
	eval(`document.querySelector('tr.queue-row[data-topic="dash-orders"] summary').click()`, nil)
	waitFor("dash-orders' partition line after a refresh", `(() => {
		const n = Number(document.body.dataset.refreshes);
		window.__opened = window.__opened || n;
		const li = document.querySelector('tr.queue-row[data-topic="dash-orders"] details[open] li.partition');
		return n > window.__opened && li && li.textContent.includes("ready 3");
	})()`)
	// Peek at its partition: the three messages with their bodies; the
	// depth stays 3 (peeking settles nothing).
	eval(`document.querySelector('tr.queue-row[data-topic="dash-orders"] li.partition button.peek').click()`, nil)
	waitFor("the peeked messages", `(() => {
		const rows = document.querySelectorAll("#peek tr.peek-row");
		return rows.length === 3 && [...rows].map((r) => r.querySelector(".preview").textContent).join("|") === "order 0|order 1|order 2" &&
			!document.querySelector("#peek").textContent.includes("null");
	})()`)
	waitFor("dash-orders still at depth 3 after the peek, two refreshes on", `(() => {
		const n = Number(document.body.dataset.refreshes);
		window.__peekedAt = window.__peekedAt || n;
		return n > window.__peekedAt + 1 &&
			document.querySelector('tr.queue-row[data-topic="dash-orders"] td.depth').dataset.depth === "3";
	})()`)
	shot("1-queues")

	// Live rates: traffic while the page watches shows as publish, deliver
	// and ack rates above zero.
	for i := range 10 {
		if _, err := c.PublishText(ctx, "dash-rate", fmt.Sprintf("m %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	rsub, err := c.Subscribe(ctx, "dash-rate")
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		select {
		case m := <-rsub.Messages():
			if err := m.Complete(ctx); err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("dash-rate: not all 10 delivered")
		}
	}
	if err := rsub.Unsubscribe(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("publish, deliver and ack rates above zero", `["publish", "deliver", "ack"].every((k) =>
		Number(document.getElementById("rate-" + k).dataset.peak) > 0)`)
	// Every counter is listed; the publishes so far (1 + 1 + 3 + 10) among them.
	eval(`document.querySelector("#counters summary").click()`, nil)
	waitFor("the publishes counter at 15 or more", `(() => {
		const dd = document.querySelector('#counters[open] dd[data-counter="publishes"]');
		return dd && Number(dd.textContent.replace(/,/g, "")) >= 15;
	})()`)
	shot("1b-rates")

	// A session goes dormant when its socket is cut: none before, one after.
	var dormant int
	eval(`document.querySelectorAll('tr.session-row[data-state="dormant"]').length`, &dormant)
	if dormant != 0 {
		t.Fatalf("%d dormant sessions before any cut", dormant)
	}
	nc, _ := hello(t, addr, protocol.ResumeIdentity{})
	nc.Close() // no END_SESSION: the broker sees a cut socket
	waitFor("a dormant session with its grace counting down", `(() => {
		const rows = document.querySelectorAll('tr.session-row[data-state="dormant"]');
		if (rows.length !== 1) return false;
		const g = rows[0].querySelector("td.grace");
		return g.dataset.graceLeftMs !== "" && /s$/.test(g.textContent);
	})()`)
	shot("2-sessions")

	// The dead letter: inspect it, then replay it from the page.
	dlRow := `document.querySelector('tr.dl-row[data-source-topic="dash-work"]')`
	waitFor("the dead letter of dash-work", dlRow)
	eval(dlRow+`.querySelector("button.dl-inspect").click()`, nil)
	waitFor("the inspected body and header", `(() => {
		const box = document.querySelector("#dl-inspect");
		return !box.hidden && box.querySelector("pre.dl-body").textContent === "poison pill" && box.textContent.includes("browser-test");
	})()`)
	shot("3-deadletter-inspect")
	binRow := `document.querySelector('tr.dl-row[data-source-topic="dash-bin"]')`
	waitFor("the binary dead letter of dash-bin", binRow)
	eval(binRow+`.querySelector("button.dl-inspect").click()`, nil)
	waitFor("the binary body as base64", fmt.Sprintf(`(() => {
		const box = document.querySelector("#dl-inspect");
		return !box.hidden && box.querySelector("pre.dl-body").textContent === %q && box.textContent.includes("Body (base64");
	})()`, base64.StdEncoding.EncodeToString(binaryBody)))
	shot("3b-deadletter-binary")
	// Page by page, one dead letter a page: both are reachable, and back.
	p2, err := b.NewPage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.Navigate(ctx, fmt.Sprintf("%s/?refresh=%d&dl_limit=1", base, dashRefreshMs)); err != nil {
		t.Fatal(err)
	}
	pageShows := func(what, topic string) {
		t.Helper()
		cond := fmt.Sprintf(`document.querySelectorAll("tr.dl-row").length === 1 && document.querySelector('tr.dl-row[data-source-topic=%q]')`, topic)
		if err := p2.WaitFor(ctx, what, cond, browserWaitMs); err != nil {
			t.Fatal(err)
		}
	}
	pageShows("page 1: dash-work's dead letter alone", "dash-work")
	if err := p2.Eval(ctx, `document.querySelector("#dl-first").disabled && (document.querySelector("#dl-next").click(), true)`, nil); err != nil {
		t.Fatal(err)
	}
	pageShows("page 2: dash-bin's dead letter alone", "dash-bin")
	if err := p2.Eval(ctx, `document.querySelector("#dl-first").click()`, nil); err != nil {
		t.Fatal(err)
	}
	pageShows("page 1 again", "dash-work")
	for _, e := range p2.Errors() {
		t.Errorf("paged page error: %v", e)
	}
	if err := p2.Navigate(ctx, "about:blank"); err != nil { // stop its polling
		t.Fatal(err)
	}
	eval(dlRow+`.querySelector("button.dl-replay").click()`, nil)
	waitFor("the replay's result", `document.querySelector("#dl-result").textContent.startsWith("Replayed 1")`)
	waitFor("the replayed dead letter gone from the list", `!`+dlRow)
	shot("4-deadletter-replayed")
	// It is back on its source queue: a consumer of dash-work gets it again.
	sub, err = c.Subscribe(ctx, "dash-work")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-sub.Messages():
		if m.Text() != "poison pill" || string(m.Key) != "k-1" {
			t.Fatalf("replayed message: body %q key %q", m.Text(), m.Key)
		}
		if v, _ := m.Header("origin"); v != "browser-test" {
			t.Fatalf("replayed message lost its header: %q", v)
		}
		if err := m.Complete(ctx); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the replayed message did not come back on dash-work")
	}

	// Replay keeping the dead-letter copy: the binary one goes back to
	// dash-bin byte for byte, and stays listed.
	eval(`document.querySelector("#dl-keep").click()`, nil)
	eval(binRow+`.querySelector("button.dl-replay").click()`, nil)
	waitFor("the replay's result, copy kept", `(() => {
		const r = document.querySelector("#dl-result").textContent;
		return r.startsWith("Replayed 1") && r.includes("dash-bin") && r.includes("(copy kept)");
	})()`)
	waitFor("the kept copy still listed after a refresh", `(() => {
		const n = Number(document.body.dataset.refreshes);
		window.__keptAt = window.__keptAt || n;
		return n > window.__keptAt + 1 && `+binRow+`;
	})()`)
	shot("4b-deadletter-kept")
	bsub, err = c.Subscribe(ctx, "dash-bin")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-bsub.Messages():
		if string(m.Body) != string(binaryBody) {
			t.Fatalf("replayed binary body %x, want %x", m.Body, binaryBody)
		}
		if err := m.Complete(ctx); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the replayed binary message did not come back on dash-bin")
	}

	// A setting changed in the form takes effect: the next HELLO_OK reports it.
	setting := `document.querySelector('#settings-fields input[data-key="connection.reconnect_grace_ms"]')`
	waitFor("the settings form", setting)
	eval(setting+`.value = "250"; `+setting+`.dispatchEvent(new Event("input")); document.querySelector("#settings-save").click()`, nil)
	waitFor("the save confirmed", `document.querySelector("#settings-msg").textContent.startsWith("Saved: version 2")`)
	shot("5-settings-saved")
	if _, ok := hello(t, addr, protocol.ResumeIdentity{}); ok.ReconnectGraceMs != 250 {
		t.Fatalf("after the form's save, HELLO_OK reports grace %d, want 250", ok.ReconnectGraceMs)
	}
	// A change made elsewhere meanwhile: the form's next save is refused and
	// shown, and the form shows the value in force.
	var doc admin.SettingsDoc
	if code := httpJSON(t, "PUT", base+"/api/v1/settings", `{"version": 2, "values": {"connection.reconnect_grace_ms": 300}}`, &doc); code != 200 {
		t.Fatalf("PUT behind the page's back: %d", code)
	}
	eval(setting+`.value = "400"; `+setting+`.dispatchEvent(new Event("input")); document.querySelector("#settings-save").click()`, nil)
	waitFor("the conflict shown", `(() => {
		const c = document.querySelector("#settings-conflict");
		return c && c.textContent.includes("version 3") && `+setting+`.value === "300";
	})()`)
	shot("6-settings-conflict")
	if code := httpJSON(t, "GET", base+"/api/v1/settings", "", &doc); code != 200 || doc.Values["connection.reconnect_grace_ms"] != 300 {
		t.Fatalf("after the refused save: %d %+v", code, doc)
	}

	// No console errors, exceptions or failed loads, except the 409 the
	// conflict step caused on purpose.
	for _, e := range p.Errors() {
		if e.Source == "log" && strings.Contains(e.Text, "status of 409") && strings.Contains(e.Text, "/api/v1/settings") {
			continue
		}
		t.Errorf("page error: %v", e)
	}
	// The page kept refreshing by itself throughout.
	var refreshes int
	eval(`Number(document.body.dataset.refreshes)`, &refreshes)
	if refreshes < 4 {
		t.Errorf("only %d refreshes", refreshes)
	}

	// With the broker gone the page says so and keeps the last data it had.
	c.Close()
	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	waitFor("the unreachable banner, with the queues still shown", `!document.querySelector("#banner").hidden &&
		document.querySelector('tr.queue-row[data-topic="dash-orders"]') !== null`)
	shot("7-broker-gone")
}

// TestDashboardShowsNodes: with cluster.enabled the page lists the node
// itself (a cluster of one) in its nodes section, as the controller
// group's leader (it bootstrapped the group).
func TestDashboardShowsNodes(t *testing.T) {
	chromium, err := cdp.Find()
	if errors.Is(err, cdp.ErrNoBrowser) {
		t.Skip("dashboard browser test skipped: " + err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	cfg := testServeConfig(t)
	cfg.Cluster.Enabled = true
	cfg.Cluster.GossipListen = "127.0.0.1:0"
	cfg.Cluster.PeerListen = "127.0.0.1:0"
	cfg.Cluster.Profile = "lan"
	_, adminAddr, _ := runServeAdmin(t, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), browserTestMs*time.Millisecond)
	defer cancel()
	dir := artifactsDir(t)
	logf, err := os.Create(filepath.Join(dir, "chromium.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	b, err := cdp.Launch(chromium, t.TempDir(), logf)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p, err := b.NewPage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Navigate(ctx, fmt.Sprintf("http://%s/?refresh=%d", adminAddr, dashRefreshMs)); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitFor(ctx, "the node itself in the nodes section", `(() => {
		const sec = document.querySelector("#nodes");
		const rows = document.querySelectorAll('#nodes tr.node-row[data-state="self"]');
		return !sec.hidden && rows.length === 1 && rows[0].dataset.nodeId.length === 32 &&
			rows[0].dataset.controller === "leader" &&
			document.querySelector("#nodes-fenced").hidden &&
			getComputedStyle(document.querySelector("#nodes-fenced")).display === "none";
	})()`, browserWaitMs); err != nil {
		_ = p.Screenshot(ctx, filepath.Join(dir, "failed.png"))
		t.Fatalf("%v\n(screenshots in %s)", err, dir)
	}
}
