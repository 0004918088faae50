package admin

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/sinewmq/sinew/protocol"
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

// sinewReplyTimeoutMs bounds writing the error to a Sinew client that
// connected to the admin listener, so one that does not read cannot hold
// the connection.
const sinewReplyTimeoutMs = 1000

// ErrSinewClient is the read error of a connection whose peer started a
// Sinew frame on the admin listener; the peer was sent an ERROR first.
var ErrSinewClient = errors.New("admin: a Sinew client connected to the admin listener")

// NotClientListenerMessage is the message of the ERROR bad_request a Sinew
// client gets from the admin listener; clientAddr is the client listener's
// address, "" when unknown.
func NotClientListenerMessage(clientAddr string) string {
	where := "the broker's client listener (listen)"
	if clientAddr != "" {
		where = "the client listener at " + clientAddr
	}
	return "this is the broker's admin (HTTP) listener, not its client listener: connect Sinew clients to " + where + " (sinew --addr)"
}

// SinewGuardListener returns ln answering a peer whose first byte starts a
// Sinew frame (0, the top byte of any frame's length prefix under 16 MiB)
// with a plaintext Sinew ERROR bad_request naming the client listener, and
// closing. An HTTP request starts with a method's letter and a TLS
// ClientHello with 0x16, so neither is affected. Without it a Sinew client
// pointed at the admin port waits for an answer net/http never sends (it
// waits for a request line). Wrap it under any TLS listener, like
// LimitListener.
func SinewGuardListener(ln net.Listener, clientAddr string) net.Listener {
	return &guardListener{Listener: ln, msg: NotClientListenerMessage(clientAddr)}
}

type guardListener struct {
	net.Listener
	msg string
}

// Accept implements net.Listener. It does no I/O: the first byte is looked
// at by the connection's first Read.
func (l *guardListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &guardConn{Conn: c, msg: l.msg}, nil
}

// guardConn looks at its first byte before passing reads through. net/http
// and crypto/tls read a connection from one goroutine at a time, so the
// fields need no lock.
type guardConn struct {
	net.Conn
	msg     string
	checked bool
	first   []byte // the byte looked at, not yet returned
}

// Read implements net.Conn.
func (c *guardConn) Read(b []byte) (int, error) {
	if !c.checked {
		var one [1]byte
		n, err := c.Conn.Read(one[:])
		if n == 0 {
			return 0, err
		}
		c.checked = true
		if one[0] == 0 {
			c.replySinew()
			return 0, ErrSinewClient
		}
		c.first = one[:1]
	}
	if len(c.first) > 0 && len(b) > 0 {
		b[0] = c.first[0]
		c.first = nil
		return 1, nil
	}
	return c.Conn.Read(b)
}

// replySinew answers the frame begun with a zero byte. When the rest of its
// header arrives (a Sinew client sends its whole HELLO at once), the ERROR
// echoes its request id so the client matches it to its HELLO; the read is
// bounded like the write.
func (c *guardConn) replySinew() {
	deadline := time.Now().Add(sinewReplyTimeoutMs * time.Millisecond)
	head := make([]byte, protocol.LengthBytes+protocol.HeaderBytes)
	var reqID uint64
	c.Conn.SetReadDeadline(deadline)
	if _, err := io.ReadFull(c.Conn, head[1:]); err == nil {
		reqID = binary.BigEndian.Uint64(head[protocol.LengthBytes+4:])
	}
	frame := protocol.AppendFrame(nil, 0, reqID, &protocol.ErrorBody{Code: protocol.CodeBadRequest, Fatal: true, Message: c.msg})
	c.Conn.SetWriteDeadline(deadline)
	c.Conn.Write(frame)
}
