package e2e_test

import (
	"bufio"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// BenchmarkLoginUnderGuessing is a soak, not a timed assertion: a real
// `sinew serve` with one user (default argon2id parameters, the default
// auth.password_hashes_max) takes wrong passwords in a loop from many
// loopback source addresses (127.0.0.2 and up, two connections each), and
// each iteration logs in once as the user, from 127.0.0.1, with the right
// password. Every legitimate login must succeed; ns/op is its latency, and
// p50-ms, max-ms and guesses/s are reported. The guessers run until every
// address has been refused once before the timer starts, so the figures are
// those of a flood in progress.
//
//	go test ./test/e2e/ -run '^$' -bench BenchmarkLoginUnderGuessing -benchtime 20x
func BenchmarkLoginUnderGuessing(b *testing.B) {
	bin := buildSinew(b)
	for _, addrs := range []int{100, 400} {
		b.Run(fmt.Sprintf("addrs=%d", addrs), func(b *testing.B) { loginUnderGuessing(b, bin, addrs) })
	}
}

func loginUnderGuessing(b *testing.B, bin string, addrs int) {
	dir := b.TempDir()
	users, err := auth.OpenUsers(vfs.OS(), broker.UsersPath(dir))
	if err != nil {
		b.Fatal(err)
	}
	if err := users.Add("alice", "correct horse battery", auth.Permissions{Publish: []string{"*"}}); err != nil {
		b.Fatal(err)
	}
	srv := startChildArgs(b, bin, dir)

	// hello dials from local (nil: any), sends HELLO and returns the first
	// answer: nil for HELLO_OK, else the error.
	hello := func(local net.Addr, password string) error {
		d := net.Dialer{LocalAddr: local, Timeout: safetyTimeout}
		nc, err := d.Dial("tcp", srv.addr)
		if err != nil {
			return err
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(safetyTimeout))
		if _, err := nc.Write(protocol.AppendFrame(nil, 0, 1, &protocol.Hello{
			ProtocolVersion: protocol.Version, User: "alice", Credentials: password})); err != nil {
			return err
		}
		f, _, err := protocol.ReadFrame(bufio.NewReader(nc), 1<<20, nil)
		if err != nil {
			return err
		}
		body, err := protocol.Decode(f)
		if err != nil {
			return err
		}
		switch v := body.(type) {
		case *protocol.HelloOK:
			return nil
		case *protocol.ErrorBody:
			return &protocol.Error{Code: v.Code, Message: v.Message}
		}
		return fmt.Errorf("answer %T", body)
	}

	const connsPerAddr = 2
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var guesses atomic.Int64
	refused := make([]atomic.Bool, addrs)
	var refusedAll sync.WaitGroup
	refusedAll.Add(addrs)
	for a := range addrs {
		// 127.0.0.2 .. 127.0.1.145 for 400: any 127/8 address is loopback.
		ip := net.IPv4(127, 0, byte((a+2)/256), byte((a+2)%256))
		for range connsPerAddr {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					err := hello(&net.TCPAddr{IP: ip}, "wrong password")
					guesses.Add(1)
					if err == nil {
						b.Error("a wrong password was accepted")
						return
					}
					if refused[a].CompareAndSwap(false, true) {
						refusedAll.Done()
					}
				}
			}()
		}
	}
	refusedAll.Wait()

	lat := make([]time.Duration, 0, b.N)
	g0, t0 := guesses.Load(), time.Now()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := hello(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, "correct horse battery"); err != nil {
			b.Fatalf("legitimate login during the flood: %v", err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	rate := float64(guesses.Load()-g0) / time.Since(t0).Seconds()
	close(stop)
	wg.Wait()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)-1])/1e6, "max-ms")
	b.ReportMetric(rate, "guesses/s")
}
