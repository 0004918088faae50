package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/cdp"
)

// TestDashboardShowsCohorts: the cohorts section is hidden (not displayed)
// while the broker knows no cohort, lists a cohort's member and each of its
// partitions once a member subscribes, with the queue's lag, and hides again
// once the member left and the partitions opened.
func TestDashboardShowsCohorts(t *testing.T) {
	chromium, err := cdp.Find()
	if errors.Is(err, cdp.ErrNoBrowser) {
		t.Skip("dashboard browser test skipped: " + err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	addr, adminAddr, _ := runServeAdmin(t, testServeConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), browserTestMs*time.Millisecond)
	defer cancel()
	c, err := sinew.Dial(ctx, addr, sinew.WithClientName("dash-cohort"), sinew.WithMemberID("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.DeclareQueue(ctx, "dash-cohort", sinew.QueueConfig{Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := c.PublishText(ctx, "dash-cohort", fmt.Sprintf("m %d", i)); err != nil {
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
	waitFor := func(what, cond string) {
		t.Helper()
		if err := p.WaitFor(ctx, what, cond, browserWaitMs); err != nil {
			_ = p.Screenshot(ctx, filepath.Join(dir, "failed.png"))
			t.Fatalf("%v\n(screenshots in %s)", err, dir)
		}
	}
	if err := p.Navigate(ctx, fmt.Sprintf("http://%s/?refresh=%d", adminAddr, dashRefreshMs)); err != nil {
		t.Fatal(err)
	}
	hidden := `(() => {
		const sec = document.querySelector("#cohorts");
		return Number(document.body.dataset.refreshes) >= 2 && sec.hidden && getComputedStyle(sec).display === "none";
	})()`
	waitFor("no cohorts section without a cohort", hidden)

	// A member that takes nothing (prefetch 1, never read): the three
	// messages stay unsettled, so the lag stays 3.
	sub, err := c.Subscribe(ctx, "dash-cohort", sinew.WithCohort("billing"), sinew.WithPrefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	waitFor("the cohort with its member and partitions", `(() => {
		const sec = document.querySelector("#cohorts");
		const row = document.querySelector('#cohorts tr.cohort-row[data-topic="dash-cohort"][data-cohort="billing"]');
		if (sec.hidden || getComputedStyle(sec).display === "none" || !row) return false;
		const parts = [...row.querySelectorAll("li.cohort-partition")];
		return row.querySelector("td.members").textContent === "worker-1" && row.querySelector("td.lag").dataset.lag === "3" &&
			parts.length === 2 && parts.every((li) => li.dataset.member === "worker-1" && li.dataset.paused === "false");
	})()`)
	if err := p.Screenshot(ctx, filepath.Join(dir, "cohorts.png")); err != nil {
		t.Errorf("screenshot: %v", err)
	}
	if err := sub.Unsubscribe(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("no cohorts section once the member left", hidden)
}
