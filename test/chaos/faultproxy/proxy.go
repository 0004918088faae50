package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const (
	chunkBytes      = 32 << 10
	chunksQueuedMax = 64
	dialTimeout     = 2 * time.Second
)

// Stats counts what a proxy did, for test logs.
type Stats struct {
	Accepted int // connections accepted
	Refused  int // connections closed at once while refusing
	Cut      int // connections reset by Cut
}

// Proxy forwards TCP connections from its listen address to a target address.
type Proxy struct {
	l      net.Listener
	target string
	wg     sync.WaitGroup
	done   chan struct{}

	mu       sync.Mutex
	conns    map[*link]struct{}
	refusing bool
	stalled  chan struct{} // open while stalled; nil when traffic flows
	delay    time.Duration
	cutBytes int64 // reset a connection once it has forwarded this many bytes; 0 = never
	stats    Stats
	closed   bool
}

// link is one proxied connection: the client side and the broker side.
type link struct {
	client, server net.Conn
	once           sync.Once
	forwarded      atomic.Int64 // bytes written, both directions
}

func (l *link) close(reset bool) {
	l.once.Do(func() {
		for _, c := range []net.Conn{l.client, l.server} {
			if tc, ok := c.(*net.TCPConn); ok && reset {
				_ = tc.SetLinger(0) // close with RST, not FIN
			}
			_ = c.Close()
		}
	})
}

// Start listens on listenAddr ("127.0.0.1:0" for any free port) and forwards
// each accepted connection to target.
func Start(listenAddr, target string) (*Proxy, error) {
	l, err := net.Listen("tcp", listenAddr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{l: l, target: target, done: make(chan struct{}), conns: make(map[*link]struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients should dial.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Cut resets every open connection. New connections are still accepted unless
// Refuse is on.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	p.stats.Cut += len(links)
	p.mu.Unlock()
	for _, l := range links {
		l.close(true)
	}
	return len(links)
}

// Refuse makes the proxy close new connections at once (on) or accept them
// again (off).
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refusing = on
}

// Stall stops forwarding bytes in both directions; sockets stay open, so only
// timeouts and heartbeats can notice.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// Unstall lets held traffic flow again.
func (p *Proxy) Unstall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// SetDelay delays every forwarded chunk by d (0 turns delay off).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// CutEvery makes the proxy reset each connection once it has forwarded n bytes
// (both directions together, checked after each chunk of at most 32 KiB), as
// a network that fails every so often would; each reconnect gets a fresh
// budget. 0 turns it off. Such cuts count in Stats.Cut.
func (p *Proxy) CutEvery(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutBytes = max(0, n)
}

// Close stops accepting, resets every connection and waits for every
// goroutine of the proxy to return.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
	p.mu.Unlock()
	err := p.l.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-p.done:
				return
			case <-time.After(10 * time.Millisecond): // transient accept error (EMFILE): back off
			}
			continue
		}
		p.mu.Lock()
		refusing := p.refusing || p.closed
		if refusing {
			p.stats.Refused++
		} else {
			p.stats.Accepted++
		}
		p.mu.Unlock()
		if refusing {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		if tc, ok := client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		client.Close()
		return
	}
	l := &link{client: client, server: server}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.close(true)
		return
	}
	p.conns[l] = struct{}{}
	p.mu.Unlock()

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(l, client, server) }()
	go func() { defer wg.Done(); p.pipe(l, server, client) }()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
}

type chunk struct {
	data []byte
	at   time.Time
}

// pipe copies src to dst through a bounded queue of stamped chunks. Any error
// on either side closes the whole link, as a real broken path would.
func (p *Proxy) pipe(l *link, src, dst net.Conn) {
	defer l.close(false)
	q := make(chan chunk, chunksQueuedMax)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		defer l.close(false)
		for c := range q {
			if !p.hold(c.at) {
				return
			}
			if _, err := dst.Write(c.data); err != nil {
				return
			}
			if p.overBudget(l, len(c.data)) {
				return
			}
		}
	}()
	defer func() { close(q); <-writerDone }()
	for {
		buf := make([]byte, chunkBytes)
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case q <- chunk{buf[:n], time.Now()}:
			case <-writerDone:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// overBudget counts n forwarded bytes on l and, when that reaches the
// CutEvery budget, resets l and reports true.
func (p *Proxy) overBudget(l *link, n int) bool {
	total := l.forwarded.Add(int64(n))
	p.mu.Lock()
	budget := p.cutBytes
	cut := budget > 0 && total >= budget
	if cut {
		p.stats.Cut++
	}
	p.mu.Unlock()
	if cut {
		l.close(true)
	}
	return cut
}

// hold waits until a chunk read at may be written: past its delay and not
// stalled. It returns false when the proxy is closing.
func (p *Proxy) hold(at time.Time) bool {
	for {
		p.mu.Lock()
		stalled, delay := p.stalled, p.delay
		p.mu.Unlock()
		if stalled != nil {
			select {
			case <-stalled:
				continue
			case <-p.done:
				return false
			}
		}
		wait := time.Until(at.Add(delay))
		if wait <= 0 {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-p.done:
			t.Stop()
			return false
		}
		// Re-check the stall: it may have begun during the delay.
	}
}
