package admin

import (
	"net"
	"sync"
)

// ConnectionsMax bounds the admin listener's open connections. HTTP peers
// that open connections and hold them (slowloris, idle keep-alives) would
// otherwise cost a goroutine and buffers each without limit; at the bound,
// LimitListener stops accepting until one closes, and further peers wait in
// the kernel's accept queue.
const ConnectionsMax = 256

// LimitListener returns ln accepting at most n connections open at once:
// Accept waits while n are open. Closing an accepted connection frees its
// slot, once. Wrap the TCP listener, under any TLS listener: net/http
// recognises TLS connections by their *tls.Conn type.
func LimitListener(ln net.Listener, n int) net.Listener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), done: make(chan struct{})}
}

type limitListener struct {
	net.Listener
	slots     chan struct{}
	done      chan struct{} // closed by Close, so a waiting Accept returns
	closeOnce sync.Once
}

// Accept implements net.Listener.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
}

// Close implements net.Listener.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// Close implements net.Conn.
func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
