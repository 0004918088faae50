package workload

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sinewmq/sinew/test/chaos/checker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func runAgainst(t *testing.T, f *fakeBroker, drain time.Duration) (checker.Report, error, *Run) {
	return runWith(t, f, drain, false)
}

func runWith(t *testing.T, f *fakeBroker, drain time.Duration, sdk bool) (checker.Report, error, *Run) {
	t.Helper()
	ck := checker.New()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := Start(ctx, Config{Addr: f.addr(), Producers: 2, Consumers: 2, MessagesPerProducer: 300,
		Prefetch: 8, Checker: ck, Logf: t.Logf, SDK: sdk})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.ProducersDone():
	case <-ctx.Done():
		t.Fatalf("producers did not finish: %s", r.Stats())
	}
	t.Logf("producers done at %dms", r.SinceMs())
	derr := r.Drain(drain)
	t.Logf("drained at %dms", r.SinceMs())
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped at %dms", r.SinceMs())
	return ck.Report(), derr, r
}

func TestCleanRunAgainstFake(t *testing.T) {
	f := startFake(t, 0)
	rep, derr, r := runAgainst(t, f, 10*time.Second)
	if derr != nil {
		t.Fatalf("drain: %v\n%s", derr, rep)
	}
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if rep.Confirmed != 600 || rep.Settled != 600 || rep.Duplicates != 0 {
		t.Fatalf("report %s; workload %s", rep, r.Stats())
	}
}

func TestCutConnectionsResendAndRedeliver(t *testing.T) {
	f := startFake(t, 0)
	f.cutAt = 150
	rep, derr, r := runAgainst(t, f, 10*time.Second)
	if derr != nil {
		t.Fatalf("drain: %v\n%s", derr, rep)
	}
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if rep.Confirmed != 600 || rep.Settled+rep.InDoubt != 600 {
		t.Fatalf("report %s; workload %s", rep, r.Stats())
	}
	if s := r.Stats().Snapshot(); s.Connects <= 4 {
		t.Fatalf("expected reconnects after the cut: %s", r.Stats())
	}
}

func TestLossyBrokerIsCaught(t *testing.T) {
	f := startFake(t, 10)
	rep, derr, _ := runAgainst(t, f, 500*time.Millisecond)
	if !errors.Is(derr, ErrDrainTimeout) {
		t.Fatalf("drain = %v, want ErrDrainTimeout", derr)
	}
	if err := rep.Err(); !errors.Is(err, checker.ErrViolation) || len(rep.Lost) != 60 {
		t.Fatalf("lost %d (want 60), err %v", len(rep.Lost), err)
	}
}

func TestSDKCleanRunAgainstFake(t *testing.T) {
	f := startFake(t, 0)
	rep, derr, r := runWith(t, f, 10*time.Second, true)
	if derr != nil {
		t.Fatalf("drain: %v\n%s", derr, rep)
	}
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if rep.Confirmed != 600 || rep.Settled != 600 {
		t.Fatalf("report %s; workload %s", rep, r.Stats())
	}
}
