package hostile_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// Bounds on every wait, so that a hung broker fails a test instead of hanging it.
const (
	dialTimeout      = 2 * time.Second
	replyTimeout     = 30 * time.Second
	publishWindowMax = 1024
	// peerPauseMs spaces a reconnecting peer's attempts.
	peerPauseMs = 50
	// slowlorisByteMs is the pause between two bytes of a slowloris HELLO.
	slowlorisByteMs = 300
	// nonreaderPingMs spaces the PINGs a non-reading consumer sends.
	nonreaderPingMs = 300
	// endReadTimeout bounds the final read that tells whether the broker closed
	// a non-reading consumer.
	endReadTimeout = 2 * time.Second
	// oversizedBodyBytes is over the default limits.body_bytes_max (1 MiB)
	// and under the default frame limit: a whole frame that is read, then
	// refused. oversizedFrameBytes is over the default frame limit.
	oversizedBodyBytes  = 1<<20 + 1024
	oversizedFrameBytes = 2 << 20
	// oversizedPauseMs spaces an oversized peer's frames: each is a
	// megabyte, and the machine is shared.
	oversizedPauseMs = 250
)

// mix says how many peers of each kind a run opens.
type mix struct {
	garbage, hugelen, slowloris, halfopen, nonreader int
	// wrongauth send HELLOs with wrong credentials in a loop; oversized
	// send frames above the body or frame limit in a loop.
	wrongauth, oversized int
	// bigNonreader are non-readers on the queue of large messages (bigTopic),
	// more than the kernel's socket buffers can absorb.
	bigNonreader int
}

func (m mix) total() int {
	return m.garbage + m.hugelen + m.slowloris + m.halfopen + m.nonreader + m.bigNonreader + m.wrongauth + m.oversized
}

// mix140 is the 140-peer mix of the measurement and the bounded test.
var mix140 = mix{garbage: 20, hugelen: 20, slowloris: 20, halfopen: 20, nonreader: 60}

// credentials go in the HELLO of every peer that means to get past it (the
// backlog publisher, the non-readers, the half-open and slowloris peers);
// a run against a broker with auth.tokens sets it.
var credentials string

// hello is the HELLO a peer named name sends, with the run's credentials.
func hello(name string) *protocol.Hello {
	return &protocol.Hello{ProtocolVersion: protocol.Version, ClientName: name, Credentials: credentials}
}

// status reads VmRSS and VmHWM (KiB) of pid from /proc.
func status(pid int) (rssKiB, hwmKiB int64, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rssKiB = v
		case "VmHWM:":
			hwmKiB = v
		}
	}
	if rssKiB == 0 {
		return 0, 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return rssKiB, hwmKiB, nil
}

// sampler records the peak VmRSS of a process while it runs.
type sampler struct {
	pid     int
	peak    atomic.Int64 // KiB
	samples atomic.Int64
	stop    chan struct{}
	done    chan struct{}
}

func startSampler(pid int, every time.Duration) *sampler {
	s := &sampler{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			if rss, _, err := status(pid); err == nil {
				s.samples.Add(1)
				if rss > s.peak.Load() {
					s.peak.Store(rss)
				}
			}
			select {
			case <-s.stop:
				return
			case <-tk.C:
			}
		}
	}()
	return s
}

func (s *sampler) finish() int64 {
	close(s.stop)
	<-s.done
	return s.peak.Load()
}

func mib(kib int64) float64 { return float64(kib) / 1024 }

// handshake dials addr and completes HELLO.
func handshake(addr, name string) (net.Conn, *bufio.Reader, error) {
	c, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return nil, nil, err
	}
	c.SetDeadline(time.Now().Add(replyTimeout))
	if _, err := c.Write(protocol.AppendFrame(nil, 0, 1, hello(name))); err != nil {
		c.Close()
		return nil, nil, err
	}
	br := bufio.NewReader(c)
	f, _, err := protocol.ReadFrame(br, protocol.FrameBytesDefault, nil)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	if f.Op != protocol.OpHelloOK {
		c.Close()
		return nil, nil, fmt.Errorf("handshake: got %v", f.Op)
	}
	c.SetDeadline(time.Time{})
	return c, br, nil
}

// publishBacklog stores n messages of bodyBytes each in topic, waiting for
// every confirm, with at most publishWindowMax unconfirmed at once.
func publishBacklog(addr, topic string, n, bodyBytes int) error {
	c, br, err := handshake(addr, "hostile-backlog")
	if err != nil {
		return err
	}
	defer c.Close()
	window := make(chan struct{}, publishWindowMax)
	errc := make(chan error, 1)
	go func() {
		var buf []byte
		for got := 0; got < n; got++ {
			c.SetReadDeadline(time.Now().Add(replyTimeout))
			var f protocol.Frame
			var err error
			f, buf, err = protocol.ReadFrame(br, protocol.FrameBytesDefault, buf)
			if err != nil {
				errc <- fmt.Errorf("backlog: after %d confirms: %w", got, err)
				return
			}
			switch f.Op {
			case protocol.OpPublishOK:
				<-window
			case protocol.OpPing:
				got--
			default:
				body, _ := protocol.Decode(f)
				errc <- fmt.Errorf("backlog: after %d confirms: got %v %+v", got, f.Op, body)
				return
			}
		}
		errc <- nil
	}()
	body := make([]byte, bodyBytes)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	var out []byte
	for i := range n {
		select {
		case window <- struct{}{}:
		case err := <-errc:
			return err
		}
		out = protocol.AppendFrame(out[:0], 0, uint64(i+2), &protocol.Publish{Topic: topic, Partition: -1, Body: body})
		if _, err := c.Write(out); err != nil {
			return fmt.Errorf("backlog: publish %d: %w", i, err)
		}
	}
	return <-errc
}

// peerStats counts what the hostile peers saw.
type peerStats struct {
	dials            atomic.Int64
	nonreaderSubs    atomic.Int64 // non-readers whose SUBSCRIBE was written
	nonreaderClosed  atomic.Int64 // non-readers the broker closed before the end
	bigClosed        atomic.Int64 // of those, non-readers on bigTopic
	nonreaderErrCode sync.Map     // protocol.Code -> *atomic.Int64, from a final ERROR
	authFailed       atomic.Int64 // wrong-credential HELLOs answered auth_failed
	tooLarge         atomic.Int64 // oversized frames answered message_too_large or frame_too_large
}

// runPeers runs m's peers against addr until ctx ends, then closes them all
// and returns what they saw. Non-readers subscribe to topic with prefetch.
func runPeers(ctx context.Context, addr, topic string, m mix, prefetch uint32) *peerStats {
	st := &peerStats{}
	var wg sync.WaitGroup
	spawn := func(n int, f func(ctx context.Context, i int, st *peerStats)) {
		for i := range n {
			wg.Add(1)
			go func() { defer wg.Done(); f(ctx, i, st) }()
		}
	}
	spawn(m.garbage, garbagePeer(addr))
	spawn(m.hugelen, hugelenPeer(addr))
	spawn(m.slowloris, slowlorisPeer(addr))
	spawn(m.halfopen, halfopenPeer(addr))
	spawn(m.nonreader, nonreaderPeer(addr, topic, prefetch, nil))
	spawn(m.bigNonreader, nonreaderPeer(addr, bigTopic, prefetch, &st.bigClosed))
	spawn(m.wrongauth, wrongauthPeer(addr))
	spawn(m.oversized, oversizedPeer(addr))
	wg.Wait()
	return st
}

// dialCtx dials addr, and closes the connection when ctx ends so that a peer
// blocked in a read or write wakes up.
func dialCtx(ctx context.Context, addr string, st *peerStats) (net.Conn, func(), error) {
	c, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return nil, nil, err
	}
	st.dials.Add(1)
	stop := context.AfterFunc(ctx, func() { c.Close() })
	return c, func() { stop(); c.Close() }, nil
}

// guesserSource is the loopback source address of the peers that guess
// credentials; the others connect from the default, 127.0.0.1.
var guesserSource = net.IPv4(127, 0, 0, 2)

// dialFromCtx is dialCtx from source address ip.
func dialFromCtx(ctx context.Context, ip net.IP, addr string, st *peerStats) (net.Conn, func(), error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: dialTimeout}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	st.dials.Add(1)
	stop := context.AfterFunc(ctx, func() { c.Close() })
	return c, func() { stop(); c.Close() }, nil
}

// pause waits peerPauseMs or until ctx ends, and reports whether ctx is live.
func pause(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// untilClosed reads and discards until the broker closes c (or ctx closes it).
func untilClosed(c net.Conn) { io.Copy(io.Discard, c) }

// garbagePeer sends random bytes and reconnects when the broker hangs up.
func garbagePeer(addr string) func(context.Context, int, *peerStats) {
	return func(ctx context.Context, i int, st *peerStats) {
		rng := rand.New(rand.NewPCG(uint64(i), 1))
		junk := make([]byte, 4<<10)
		for ctx.Err() == nil {
			c, done, err := dialCtx(ctx, addr, st)
			if err == nil {
				for j := range junk {
					junk[j] = byte(rng.Uint32())
				}
				c.Write(junk)
				untilClosed(c)
				done()
			}
			if !pause(ctx, peerPauseMs*time.Millisecond) {
				return
			}
		}
	}
}

// hugelenPeer announces an enormous frame (even i), or one just under the
// limit and then sends nothing more (odd i).
func hugelenPeer(addr string) func(context.Context, int, *peerStats) {
	return func(ctx context.Context, i int, st *peerStats) {
		helloFrame := protocol.AppendFrame(nil, 0, 1, hello("hugelen"))
		for ctx.Err() == nil {
			c, done, err := dialCtx(ctx, addr, st)
			if err == nil {
				f := append([]byte(nil), helloFrame...)
				if i%2 == 0 {
					binary.BigEndian.PutUint32(f, 0xFFFF_FFF0)
				} else {
					binary.BigEndian.PutUint32(f, uint32(protocol.FrameBytesDefault-protocol.LengthBytes-1))
				}
				c.Write(f)
				untilClosed(c)
				done()
			}
			if !pause(ctx, peerPauseMs*time.Millisecond) {
				return
			}
		}
	}
}

// slowlorisPeer sends a HELLO one byte at a time.
func slowlorisPeer(addr string) func(context.Context, int, *peerStats) {
	return func(ctx context.Context, i int, st *peerStats) {
		helloFrame := protocol.AppendFrame(nil, 0, 1, hello("slowloris"))
		for ctx.Err() == nil {
			c, done, err := dialCtx(ctx, addr, st)
			if err == nil {
				for _, b := range helloFrame[:len(helloFrame)-1] {
					if _, err := c.Write([]byte{b}); err != nil || !pause(ctx, slowlorisByteMs*time.Millisecond) {
						break
					}
				}
				done()
			}
			if !pause(ctx, peerPauseMs*time.Millisecond) {
				return
			}
		}
	}
}

// halfopenPeer connects and sends nothing (even i), or completes HELLO and
// then sends nothing (odd i); it holds the connection until the broker closes it.
func halfopenPeer(addr string) func(context.Context, int, *peerStats) {
	return func(ctx context.Context, i int, st *peerStats) {
		for ctx.Err() == nil {
			c, done, err := dialCtx(ctx, addr, st)
			if err == nil {
				if i%2 == 1 {
					c.Write(protocol.AppendFrame(nil, 0, 1, hello("halfopen")))
				}
				untilClosed(c)
				done()
			}
			if !pause(ctx, peerPauseMs*time.Millisecond) {
				return
			}
		}
	}
}

// nonreaderPeer subscribes to topic with prefetch and never reads its socket
// while ctx lives, though it keeps sending PINGs. At the end it reads what is there, briefly, to tell whether
// the broker had closed the connection and with which ERROR code.
func nonreaderPeer(addr, topic string, prefetch uint32, closed *atomic.Int64) func(context.Context, int, *peerStats) {
	return func(ctx context.Context, i int, st *peerStats) {
		c, err := net.DialTimeout("tcp", addr, dialTimeout)
		if err != nil {
			return
		}
		defer c.Close()
		st.dials.Add(1)
		// A small receive buffer keeps the kernel from absorbing what the
		// broker sends, as a slow peer on a real network would.
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetReadBuffer(16 << 10)
		}
		out := protocol.AppendFrame(nil, 0, 1, hello("nonreader"))
		out = protocol.AppendFrame(out, 0, 2, &protocol.Subscribe{Topic: topic, Partition: -1, AckMode: protocol.AckManual, Prefetch: prefetch})
		if _, err := c.Write(out); err != nil {
			return
		}
		st.nonreaderSubs.Add(1)
		// It keeps sending PINGs, so only its failure to read can get it
		// closed, not the heartbeat timeout.
		tk := time.NewTicker(nonreaderPingMs * time.Millisecond)
		for live := true; live; {
			select {
			case <-ctx.Done():
				live = false
			case <-tk.C:
				c.SetWriteDeadline(time.Now().Add(nonreaderPingMs * time.Millisecond))
				c.Write(protocol.AppendFrame(nil, 0, 3, &protocol.Ping{}))
			}
		}
		tk.Stop()
		// Drain what the broker queued: a live connection keeps answering
		// until the deadline, a closed one ends in EOF or a reset.
		c.SetReadDeadline(time.Now().Add(endReadTimeout))
		br := bufio.NewReaderSize(c, 64<<10)
		var buf []byte
		for {
			var f protocol.Frame
			f, buf, err = protocol.ReadFrame(br, protocol.FrameBytesDefault, buf)
			if err != nil {
				break
			}
			if f.Op == protocol.OpError {
				if b, derr := protocol.Decode(f); derr == nil {
					code := b.(*protocol.ErrorBody).Code
					v, _ := st.nonreaderErrCode.LoadOrStore(code, new(atomic.Int64))
					v.(*atomic.Int64).Add(1)
				}
			}
		}
		var ne net.Error
		if !(errors.As(err, &ne) && ne.Timeout()) {
			st.nonreaderClosed.Add(1)
			if closed != nil {
				closed.Add(1)
			}
		}
	}
}

// errCodes renders the final ERROR codes the non-readers saw.
func (st *peerStats) errCodes() string {
	var parts []string
	st.nonreaderErrCode.Range(func(k, v any) bool {
		parts = append(parts, fmt.Sprintf("%v=%d", k.(protocol.Code), v.(*atomic.Int64).Load()))
		return true
	})
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// wrongauthPeer sends a HELLO with a wrong credential (a wrong token, or a
// user name with a wrong password, in turn), reads the answer until the
// broker closes the connection, and does it again. It connects from
// guesserSource, not from the address of the peers that log in: the broker
// takes credential checks from one source address one at a time, a failed
// one holding the address through its failure delay, so a well-behaved
// client behind the same address as a guesser waits its turn (docs/security.md).
func wrongauthPeer(addr string) func(context.Context, int, *peerStats) {
	return func(ctx context.Context, i int, st *peerStats) {
		for n := 0; ctx.Err() == nil; n++ {
			c, done, err := dialFromCtx(ctx, guesserSource, addr, st)
			if err == nil {
				h := hello("wrongauth")
				h.Credentials = fmt.Sprintf("wrong-%d-%d", i, n)
				if n%2 == 1 {
					// A user name makes the broker check the password
					// against its users store: an argon2id hash.
					h.User = fmt.Sprintf("hostile-%d", i)
				}
				c.Write(protocol.AppendFrame(nil, 0, 1, h))
				if code, ok := readError(c); ok && code == protocol.CodeAuthFailed {
					st.authFailed.Add(1)
				}
				untilClosed(c)
				done()
			}
			if !pause(ctx, peerPauseMs*time.Millisecond) {
				return
			}
		}
	}
}

// oversizedPeer completes HELLO, then sends whole PUBLISH frames whose body
// is over the body limit (even i: each is refused, the connection stays) or
// one whole frame over the frame limit (odd i: the connection is cut, and
// it reconnects).
func oversizedPeer(addr string) func(context.Context, int, *peerStats) {
	return func(ctx context.Context, i int, st *peerStats) {
		helloFrame := protocol.AppendFrame(nil, 0, 1, hello("oversized"))
		body := make([]byte, oversizedBodyBytes)
		if i%2 == 1 {
			body = make([]byte, oversizedFrameBytes)
		}
		publish := protocol.AppendFrame(nil, 0, 2, &protocol.Publish{Topic: "oversized", Partition: -1, Body: body})
		for ctx.Err() == nil {
			c, done, err := dialCtx(ctx, addr, st)
			if err != nil {
				if !pause(ctx, peerPauseMs*time.Millisecond) {
					return
				}
				continue
			}
			br := bufio.NewReaderSize(c, 64<<10)
			c.Write(helloFrame)
			if f, _, err := protocol.ReadFrame(br, protocol.FrameBytesDefault, nil); err != nil || f.Op != protocol.OpHelloOK {
				done()
				if !pause(ctx, peerPauseMs*time.Millisecond) {
					return
				}
				continue
			}
			for ctx.Err() == nil {
				if _, err := c.Write(publish); err != nil {
					break
				}
				code, ok := readError(br)
				if !ok {
					break
				}
				if code == protocol.CodeMessageTooLarge || code == protocol.CodeFrameTooLarge {
					st.tooLarge.Add(1)
				}
				if code == protocol.CodeFrameTooLarge || !pause(ctx, oversizedPauseMs*time.Millisecond) {
					break
				}
			}
			done()
			if !pause(ctx, oversizedPauseMs*time.Millisecond) {
				return
			}
		}
	}
}

// readError reads frames from r (answering nothing) until an ERROR, and
// returns its code; false when the connection ends first.
func readError(r io.Reader) (protocol.Code, bool) {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReader(r)
	}
	var buf []byte
	for {
		var f protocol.Frame
		var err error
		f, buf, err = protocol.ReadFrame(br, protocol.FrameBytesDefault, buf)
		if err != nil {
			return 0, false
		}
		if f.Op != protocol.OpError {
			continue
		}
		b, err := protocol.Decode(f)
		if err != nil {
			return 0, false
		}
		return b.(*protocol.ErrorBody).Code, true
	}
}
