package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
)

// declareLease declares topic with the given lease through the SDK.
func declareLease(t *testing.T, addr, topic string, lease time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := sinew.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.DeclareQueue(ctx, topic, sinew.QueueConfig{Lease: lease}); err != nil {
		t.Fatal(err)
	}
}

// TestConsumeExecSettlesByExitStatus: exit 0 completes a message, any other
// status retries it; the command gets the body on stdin and the message's
// position in its environment.
func TestConsumeExecSettlesByExitStatus(t *testing.T) {
	addr := startClientTestBroker(t)
	if code, _, errOut := runCmd(t, "a\nb\n", "publish", "--addr", addr, "--topic", "ex"); code != 0 {
		t.Fatalf("publish: %s", errOut)
	}
	// The first attempt of each message fails, the second succeeds.
	code, out, errOut := runCmd(t, "", "consume", "--addr", addr, "--topic", "ex", "--count", "4",
		"--exec", `read b; echo "$b $SINEW_TOPIC $SINEW_ATTEMPT"; [ "$SINEW_ATTEMPT" -ge 2 ]`)
	if code != 0 {
		t.Fatalf("consume --exec exit %d: %s", code, errOut)
	}
	got := strings.Split(strings.TrimSpace(out), "\n")
	slices.Sort(got)
	if want := []string{"a ex 1", "a ex 2", "b ex 1", "b ex 2"}; !slices.Equal(got, want) {
		t.Fatalf("handled %q, want %q in some order", out, want)
	}
	if strings.Count(errOut, "command failed") != 2 {
		t.Fatalf("stderr %q, want two failures reported", errOut)
	}
	// Both were completed: nothing is left.
	code, out, errOut = runCmd(t, "", "consume", "--addr", addr, "--topic", "ex", "--idle-exit", "300ms", "--exec", "cat")
	if code != 0 || out != "" {
		t.Fatalf("second consume exit %d, out %q, err %q", code, out, errOut)
	}
}

// TestConsumeExecExtendsTheLease: a command that runs three times the
// queue's lease keeps its message with --extend-every: it is completed
// once, never delivered again. Without --extend-every the same command
// outlives its lease and its ACK is stale.
func TestConsumeExecExtendsTheLease(t *testing.T) {
	addr := startClientTestBroker(t)
	const lease = 600 * time.Millisecond
	for _, tc := range []struct {
		topic  string
		extend []string
		stale  bool
	}{
		{"ext-on", []string{"--extend-every", "200ms"}, false},
		{"ext-off", nil, true},
	} {
		declareLease(t, addr, tc.topic, lease)
		if code, _, errOut := runCmd(t, "slow\n", "publish", "--addr", addr, "--topic", tc.topic); code != 0 {
			t.Fatalf("publish: %s", errOut)
		}
		args := append([]string{"consume", "--addr", addr, "--topic", tc.topic, "--count", "1", "--exec", "sleep 1.8; cat"}, tc.extend...)
		code, out, errOut := runCmd(t, "", args...)
		if code != 0 || out != "slow" {
			t.Fatalf("%s: exit %d, out %q, err %q", tc.topic, code, out, errOut)
		}
		if stale := strings.Contains(errOut, "was stale"); stale != tc.stale {
			t.Fatalf("%s: stale ACK %v, want %v; stderr %q", tc.topic, stale, tc.stale, errOut)
		}
		// With the lease extended the message was completed; without, it
		// came back and is there to take.
		code, out, errOut = runCmd(t, "", "consume", "--addr", addr, "--topic", tc.topic, "--idle-exit", "500ms", "--exec", "cat")
		if want := map[bool]string{false: "", true: "slow"}[tc.stale]; code != 0 || out != want {
			t.Fatalf("%s: second consume exit %d, out %q (want %q), err %q", tc.topic, code, out, want, errOut)
		}
	}
}

func TestConsumeExecUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--extend-every", "1s"}, "needs --exec"},
		{[]string{"--exec", "cat", "--extend-every", "-1s"}, "must not be negative"},
		{[]string{"--exec", "cat", "--extend-every", "1us"}, "below 1ms"},
		{[]string{"--exec", "cat", "--extend-every", "1000h"}, "above"},
		{[]string{"--exec", "  "}, "--exec needs a command"},
		{[]string{"--exec", "cat", "--json"}, "does not go with"},
		{[]string{"--exec", "cat", "--peek"}, "does not go with"},
		{[]string{"--exec", "cat", "--auto-ack"}, "does not go with"},
		{[]string{"--exec", "cat", "--extend-every", "soon"}, "invalid value"},
		{[]string{"--cohort", ""}, "--cohort needs a name"},
		{[]string{"--cohort", "c", "--member", ""}, "--member needs an id"},
		{[]string{"--member", "m"}, "it needs --cohort"},
	} {
		args := append([]string{"consume", "--addr", "127.0.0.1:1", "--topic", "t"}, tc.args...)
		code, _, errOut := runCmd(t, "", args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestConsumeExecReportsCohortAssignments: with --exec, a cohort member
// still reports its partitions on stderr, beside the commands it runs.
func TestConsumeExecReportsCohortAssignments(t *testing.T) {
	addr := startClientTestBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := sinew.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeclareQueue(ctx, "exco", sinew.QueueConfig{Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{0, 1} {
		if _, err := c.Publish(ctx, "exco", []byte("m"), sinew.WithPartition(p)); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	code, out, errOut := runCmd(t, "", "consume", "--addr", addr, "--topic", "exco", "--cohort", "co", "--member", "x",
		"--count", "2", "--exec", "cat")
	if code != 0 || out != "mm" {
		t.Fatalf("consume --exec --cohort exit %d, out %q, err %q", code, out, errOut)
	}
	for _, want := range []string{"joined cohort co as member x", "partition 0 assigned", "partition 1 assigned"} {
		if !strings.Contains(errOut, want) {
			t.Fatalf("stderr %q does not report %q", errOut, want)
		}
	}
}
