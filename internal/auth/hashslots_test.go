package auth

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
)

var cheapParams = HashParams{TimeCost: 1, MemoryKiB: 64, Threads: 1}

// When every slot is taken, a clean waiter goes before every suspect one,
// each queue first come, first served; a waiter whose context ends leaves
// holding nothing.
func TestHashSlotsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newHashSlots(1)
		if err := s.acquire(context.Background(), true); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var order []string
		wait := func(name string, suspect bool) {
			go func() {
				if err := s.acquire(context.Background(), suspect); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				s.release()
			}()
			synctest.Wait()
		}
		wait("suspect1", true)
		wait("suspect2", true)
		wait("clean1", false)
		wait("clean2", false)

		ctx, cancel := context.WithCancel(context.Background())
		gaveUp := make(chan error, 1)
		go func() { gaveUp <- s.acquire(ctx, false) }()
		synctest.Wait()
		if c, sus := s.waiting(); c != 3 || sus != 2 {
			t.Fatalf("waiting %d clean, %d suspect; want 3, 2", c, sus)
		}
		cancel()
		if err := <-gaveUp; !errors.Is(err, context.Canceled) {
			t.Fatalf("a waiter whose context ended: %v", err)
		}
		s.release()
		synctest.Wait()
		want := "clean1 clean2 suspect1 suspect2"
		if got := strings.Join(order, " "); got != want {
			t.Fatalf("order %q, want %q", got, want)
		}
		if s.free != 1 {
			t.Fatalf("%d slots free at the end, want 1", s.free)
		}
	})
}

// An address is suspect from its failure for SuspectWindow on the injected
// clock, and the table forgets it then.
func TestSuspectsWindow(t *testing.T) {
	var s suspects
	t0 := time.Unix(1_000_000, 0)
	s.note("10.0.0.1", t0)
	s.note("", t0) // no address: nothing to remember
	if !s.is("10.0.0.1", t0.Add(SuspectWindow-time.Nanosecond)) || s.is("10.0.0.2", t0) || s.is("", t0) {
		t.Fatal("suspects within the window")
	}
	s.note("10.0.0.2", t0.Add(SuspectWindow/2))
	s.note("10.0.0.1", t0.Add(SuspectWindow/2)) // failed again: the window starts over
	if !s.is("10.0.0.1", t0.Add(SuspectWindow)) {
		t.Fatal("an address that failed again was forgotten with its first failure")
	}
	if s.is("10.0.0.1", t0.Add(SuspectWindow*3/2)) || s.len() != 0 {
		t.Fatalf("past the window: %d remembered", s.len())
	}
}

// The table holds at most suspectsMax addresses: past it the oldest goes.
func TestSuspectsBounded(t *testing.T) {
	var s suspects
	t0 := time.Unix(1_000_000, 0)
	for i := range suspectsMax + 10 {
		s.note(string(rune(0x10000+i)), t0)
	}
	if s.len() != suspectsMax || s.is(string(rune(0x10000)), t0) || !s.is(string(rune(0x10000+suspectsMax+9)), t0) {
		t.Fatalf("%d remembered, want the newest %d", s.len(), suspectsMax)
	}
}

// A password check that finds no hash slot before its context ends returns
// ErrBusy: nothing was hashed, and the source is not marked as having
// failed. A wrong password marks it; its next check then waits behind a
// clean source's.
func TestVerifyFromBusyAndSuspect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		var holding sync.WaitGroup
		var mu sync.Mutex
		block := false
		u, err := OpenUsersWith(vfs.NewMem(), "/users", UsersOptions{Params: cheapParams, HashesMax: 1, OnHash: func() {
			mu.Lock()
			b := block
			mu.Unlock()
			if b {
				holding.Done()
				<-hold
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		if err := u.Add("alice", "correct horse", Permissions{}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		block = true
		mu.Unlock()
		holding.Add(1)
		go u.VerifyFrom(context.Background(), "10.0.0.7", "alice", "correct horse") // holds the only slot
		holding.Wait()
		mu.Lock()
		block = false
		mu.Unlock()

		hashed := u.hashes.Load()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = u.VerifyFrom(ctx, "10.0.0.9", "alice", "wrong password")
		cancel()
		if !errors.Is(err, ErrBusy) || errors.Is(err, ErrAuthFailed) {
			t.Fatalf("check past its deadline: %v, want ErrBusy", err)
		}
		if u.hashes.Load() != hashed || u.suspects.is("10.0.0.9", time.Now()) {
			t.Fatal("a check that found no slot hashed or marked its source")
		}
		close(hold)
		synctest.Wait()

		if _, err := u.VerifyFrom(context.Background(), "10.0.0.9", "alice", "wrong password"); !errors.Is(err, ErrAuthFailed) {
			t.Fatalf("wrong password: %v", err)
		}
		if !u.suspects.is("10.0.0.9", time.Now()) {
			t.Fatal("a failed check did not mark its source")
		}
		if _, err := u.VerifyFrom(context.Background(), "10.0.0.9", "alice", "correct horse"); err != nil {
			t.Fatalf("right password from a suspect source, no contention: %v", err)
		}
	})
}

func TestOpenUsersWithHashesMax(t *testing.T) {
	for _, n := range []int{-1, HashesMaxLimit + 1} {
		if _, err := OpenUsersWith(vfs.NewMem(), "/users", UsersOptions{HashesMax: n}); err == nil {
			t.Fatalf("HashesMax %d accepted", n)
		}
	}
	u, err := OpenUsersWith(vfs.NewMem(), "/users", UsersOptions{})
	if err != nil || u.slots.free != HashesMaxDefault || u.params != DefaultHashParams {
		t.Fatalf("defaults: %v, %d slots, %+v", err, u.slots.free, u.params)
	}
}

func TestCheckToken(t *testing.T) {
	for _, tok := range []string{"", "t", strings.Repeat("a", TokenBytesMin-1), strings.Repeat("a", TokenBytesMax+1),
		strings.Repeat("a", 31) + " b", strings.Repeat("é", 20), strings.Repeat("a", 40) + "\n"} {
		err := CheckToken(tok)
		if err == nil {
			t.Fatalf("token of %d bytes accepted", len(tok))
		}
		if len(tok) > 2 && strings.Contains(err.Error(), tok) {
			t.Fatalf("error %q holds the token", err)
		}
	}
	for _, tok := range []string{strings.Repeat("x", TokenBytesMin), strings.Repeat("~", TokenBytesMax), GenerateToken()} {
		if err := CheckToken(tok); err != nil {
			t.Fatalf("token of %d bytes: %v", len(tok), err)
		}
	}
	if a, b := GenerateToken(), GenerateToken(); a == b || len(a) != 64 {
		t.Fatalf("generated %q and %q", a, b)
	}
}
