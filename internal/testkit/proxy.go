package testkit

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// proxyChunkBytes is the copy buffer per direction.
const proxyChunkBytes = 32 << 10

// Proxy forwards TCP connections from a loopback listener to a target address
// and injects faults on command. All methods are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[*pair]struct{}
	refuse  bool
	delay   time.Duration
	stalled bool
	unstall chan struct{} // closed when a stall ends
	// downStalled stops only the server-to-client direction; undown is
	// closed when it ends.
	downStalled bool
	undown      chan struct{}
	closed      bool
	accepts     int
	wg          sync.WaitGroup
}

type pair struct{ client, server net.Conn }

func (p *pair) close() { _ = p.client.Close(); _ = p.server.Close() }

// NewProxy listens on 127.0.0.1:0 and forwards to target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: make(map[*pair]struct{}), unstall: make(chan struct{}),
		undown: make(chan struct{})}
	close(p.unstall)
	close(p.undown)
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the address clients should dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Accepted returns how many connections the proxy has accepted, refused ones
// included.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepts
}

// Conns returns the number of live proxied connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// CutAll closes every live proxied connection at once, both sides, as a
// network failure would. New connections are still accepted.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	conns := p.conns
	p.conns = make(map[*pair]struct{})
	p.mu.Unlock()
	for c := range conns {
		c.close()
	}
}

// SetRefuse makes the proxy reset new connections as soon as they are
// accepted (the client sees a reset or EOF, as from a refused port) while on.
func (p *Proxy) SetRefuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// SetDelay delays every forwarded chunk by d in both directions.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// SetStalled stops forwarding bytes in both directions while on; connections
// stay open, as with a peer that hangs. Bytes already read wait in the proxy.
func (p *Proxy) SetStalled(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on == p.stalled {
		return
	}
	p.stalled = on
	if on {
		p.unstall = make(chan struct{})
	} else {
		close(p.unstall)
	}
}

// SetDownStalled stops forwarding bytes from the server to the client while
// on, and keeps forwarding the client's: requests arrive and take effect,
// their answers do not, as when a link breaks right after a request.
func (p *Proxy) SetDownStalled(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on == p.downStalled {
		return
	}
	p.downStalled = on
	if on {
		p.undown = make(chan struct{})
	} else {
		close(p.undown)
	}
}

// Close stops listening, closes every connection and waits for the proxy's
// goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	if p.stalled {
		p.stalled = false
		close(p.unstall)
	}
	if p.downStalled {
		p.downStalled = false
		close(p.undown)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.CutAll()
	p.wg.Wait()
	return err
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.accepts++
		refuse, closed := p.refuse, p.closed
		p.mu.Unlock()
		if refuse || closed {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // reset, not an orderly close
			}
			_ = c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		pr := &pair{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pr.close()
			continue
		}
		p.conns[pr] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.copy(pr, s, c)
		go p.copy(pr, c, s)
	}
}

func (p *Proxy) copy(pr *pair, dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, pr)
		p.mu.Unlock()
		pr.close()
	}()
	buf := make([]byte, proxyChunkBytes)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			delay, unstall, undown := p.delay, p.unstall, p.undown
			p.mu.Unlock()
			<-unstall
			if dst == pr.client {
				<-undown
			}
			if delay > 0 {
				time.Sleep(delay) // injected latency, not a wait for a condition
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			return
		}
	}
}
