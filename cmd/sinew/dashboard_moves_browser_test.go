package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/internal/cdp"
)

// TestDashboardShowsMoves: the dashboard's Moves section lists a running
// move with each partition's step and the target's lag, and its cancel
// button cancels it through POST /api/v1/moves/{id}/cancel; an ended move
// has no button. The admin handler is the real one; the cluster behind it
// is a stand-in holding two moves (the moves' own path is tested against
// real clusters in test/e2e).
func TestDashboardShowsMoves(t *testing.T) {
	chromium, err := cdp.Find()
	if errors.Is(err, cdp.ErrNoBrowser) {
		t.Skip("dashboard browser test skipped: " + err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	cancelled := map[uint64]string{}
	lag, applied, commit := uint64(42), uint64(958), uint64(1000)
	moves := func() []admin.MoveView {
		mu.Lock()
		defer mu.Unlock()
		running := admin.MoveView{ID: 12, Topic: "orders", From: "aaaa", FromAddr: "127.0.0.1:7001", To: "bbbb", ToAddr: "127.0.0.1:7004",
			State: "catching_up", Cancellable: true, StartedAt: 12,
			Partitions: []admin.MovePartitionView{{Partition: 0, Moving: true, Step: "catching_up", Owner: "127.0.0.1:7001", Applied: &applied, Commit: &commit, Lag: &lag}}}
		if r, ok := cancelled[12]; ok {
			running.State, running.Cancellable, running.Reason, running.EndedAt, running.Partitions = "cancelled", false, r, 20, nil
		}
		return []admin.MoveView{running, {ID: 5, Topic: "audit", From: "cccc", To: "bbbb", State: "done", StartedAt: 5, EndedAt: 9}}
	}
	h := admin.Handler(admin.Config{
		Ready: func() bool { return true },
		Moves: func(context.Context) admin.MovesView {
			return admin.MovesView{Cluster: true, Moves: moves(), Pinned: []admin.QueueRef{{Topic: "audit"}}}
		},
		CancelMove: func(_ context.Context, id uint64, reason string) (admin.MoveView, error) {
			mu.Lock()
			cancelled[id] = "cancelled by an operator"
			mu.Unlock()
			return admin.MoveView{ID: id, State: "cancelled"}, nil
		},
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()

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
	if err := p.Navigate(ctx, fmt.Sprintf("http://%s/?refresh=%d", ln.Addr(), dashRefreshMs)); err != nil {
		t.Fatal(err)
	}
	wait := func(what, cond string) {
		t.Helper()
		if err := p.WaitFor(ctx, what, cond, browserWaitMs); err != nil {
			_ = p.Screenshot(ctx, filepath.Join(dir, "failed.png"))
			t.Fatalf("%v\n(screenshots in %s)", err, dir)
		}
	}
	wait("the running move with its step, lag and a cancel button, the done one without", `(() => {
		const sec = document.querySelector("#moves");
		const run = document.querySelector('#moves tr.move-row[data-move-id="12"]');
		const done = document.querySelector('#moves tr.move-row[data-move-id="5"]');
		return !sec.hidden && document.querySelector("#moves-empty").hidden && run && done &&
			run.dataset.state === "catching_up" && run.textContent.includes("0: catching_up (lag 42)") &&
			run.textContent.includes("127.0.0.1:7004") && run.querySelector("button.move-cancel") !== null &&
			done.dataset.state === "done" && done.querySelector("button.move-cancel") === null &&
			!document.querySelector("#moves-pinned").hidden && document.querySelector("#moves-pinned").textContent.includes("audit");
	})()`)
	_ = p.Screenshot(ctx, filepath.Join(dir, "1-moves.png"))
	if err := p.Eval(ctx, `document.querySelector('#moves button.move-cancel[data-move-id="12"]').click()`, nil); err != nil {
		t.Fatal(err)
	}
	wait("the move cancelled, without its button", `(() => {
		const run = document.querySelector('#moves tr.move-row[data-move-id="12"]');
		return run && run.dataset.state === "cancelled" && run.querySelector("button.move-cancel") === null &&
			document.querySelector("#moves-msg").textContent.includes("move 12 cancelled");
	})()`)
	_ = p.Screenshot(ctx, filepath.Join(dir, "2-cancelled.png"))
	mu.Lock()
	defer mu.Unlock()
	if _, ok := cancelled[12]; !ok || len(cancelled) != 1 {
		t.Fatalf("cancels received: %v, want move 12", cancelled)
	}
	// The stand-in serves no queues, settings or dead letters: the page's
	// requests for them fail, and the browser logs each. Anything else is
	// the page's own error.
	for _, e := range p.Errors() {
		if !strings.Contains(e.Text, "Failed to load resource") || strings.Contains(fmt.Sprint(e), "/api/v1/moves") {
			t.Errorf("console error: %+v", e)
		}
	}
}
