package main

import (
	"strings"
	"testing"
)

func TestQueuePurgeAndDelete(t *testing.T) {
	addr := startClientTestBroker(t)
	if code, _, errOut := runCmd(t, "a\nb\nc\n", "publish", "--addr", addr, "--topic", "work", "--group", "g"); code != 0 {
		t.Fatalf("publish exit %d: %s", code, errOut)
	}
	code, out, errOut := runCmd(t, "", "queue", "purge", "--addr", addr, "--topic", "work", "--group", "g")
	if code != 0 || out != "purged 3 messages from queue \"work\" group \"g\"\n" {
		t.Fatalf("purge exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = runCmd(t, "", "queue", "delete", "--addr", addr, "--topic", "work", "--group", "g")
	if code != 0 || out != "deleted queue \"work\" group \"g\"\n" {
		t.Fatalf("delete exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, _, errOut = runCmd(t, "", "queue", "delete", "--addr", addr, "--topic", "work", "--group", "g")
	if code != 1 || !strings.Contains(errOut, "not_found") {
		t.Fatalf("second delete exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = runCmd(t, "", "queue", "purge", "--addr", addr, "--topic", "nope")
	if code != 1 || !strings.Contains(errOut, "not_found") {
		t.Fatalf("purge of a missing queue exit %d, stderr %q", code, errOut)
	}
}

func TestQueueUsage(t *testing.T) {
	for _, args := range [][]string{{"queue"}, {"queue", "drop"}, {"queue", "delete"}, {"queue", "purge", "--topic", "x", "extra"}} {
		if code, _, errOut := runCmd(t, "", args...); code != 2 || errOut == "" {
			t.Errorf("%v: exit %d, stderr %q; want a usage error", args, code, errOut)
		}
	}
	if code, _, errOut := runCmd(t, "", "help"); code != 0 || !strings.Contains(errOut, "queue delete|purge") {
		t.Errorf("help exit %d does not list queue: %q", code, errOut)
	}
}

// TestBadAddrIsAUsageError: an --addr that cannot be dialled is a usage
// error (exit 2) at once, not a connect retried for seconds.
func TestBadAddrIsAUsageError(t *testing.T) {
	for _, addr := range []string{"garbage", "127.0.0.1:99999", "127.0.0.1:", "127.0.0.1:x"} {
		for _, args := range [][]string{
			{"publish", "--topic", "t", "--addr", addr},
			{"consume", "--topic", "t", "--addr", addr},
			{"queue", "purge", "--topic", "t", "--addr", addr},
			{"bench", "publish", "--addr", addr},
		} {
			code, _, errOut := runCmd(t, "x\n", args...)
			if code != 2 || !strings.Contains(errOut, "--addr") || strings.Contains(errOut, "connect attempt failed") {
				t.Errorf("%v: exit %d, stderr %q; want a usage error naming --addr, before any connect attempt", args, code, errOut)
			}
		}
	}
}

func TestBenchZeroDurationIsAUsageError(t *testing.T) {
	for _, d := range []string{"0s", "-1s"} {
		if code, _, errOut := runCmd(t, "", "bench", "publish", "--duration", d); code != 2 || !strings.Contains(errOut, "--duration") {
			t.Errorf("--duration %s: exit %d, stderr %q; want a usage error", d, code, errOut)
		}
	}
}
