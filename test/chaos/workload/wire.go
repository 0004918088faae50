package workload

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// Bounds on one connection's waits.
const (
	dialTimeout       = 2 * time.Second
	writeTimeout      = 5 * time.Second
	heartbeatMsFloor  = 200
	heartbeatMsAssume = 5000 // used when HELLO_OK announces 0
)

// errClosed reports use of a connection after it failed.
var errClosed = errors.New("workload: connection closed")

// wconn is one protocol connection of a workload client. The owner goroutine
// reads frames with next; writes may come from any goroutine (they are
// serialised by wmu).
type wconn struct {
	nc    net.Conn
	br    *bufio.Reader
	hello protocol.HelloOK
	buf   []byte
	req   atomic.Uint64

	wmu  sync.Mutex
	wbuf []byte
}

// dial connects to addr (with cfg.Dial) and completes HELLO, offering
// resume when it is set.
func dial(ctx context.Context, cfg *Config, addr, name string, resume protocol.ResumeIdentity) (*wconn, error) {
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	nc, err := cfg.Dial(dctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &wconn{nc: nc, br: bufio.NewReaderSize(nc, 64<<10)}
	if _, err := c.send(0, &protocol.Hello{
		ProtocolVersion: protocol.Version, ClientName: name, ClientVersion: "chaos", Resume: resume,
	}); err != nil {
		nc.Close()
		return nil, err
	}
	_ = nc.SetReadDeadline(time.Now().Add(dialTimeout * 2))
	f, err := c.readFrame(protocol.FrameBytesDefault)
	if err != nil {
		nc.Close()
		return nil, err
	}
	body, err := protocol.Decode(f)
	if err != nil {
		nc.Close()
		return nil, err
	}
	switch m := body.(type) {
	case *protocol.HelloOK:
		c.hello = *m
		if c.hello.HeartbeatMs == 0 {
			c.hello.HeartbeatMs = heartbeatMsAssume
		}
		c.hello.HeartbeatMs = max(c.hello.HeartbeatMs, heartbeatMsFloor)
		return c, nil
	case *protocol.ErrorBody:
		nc.Close()
		return nil, m.Err()
	default:
		nc.Close()
		return nil, fmt.Errorf("workload: handshake got %v", f.Op)
	}
}

func (c *wconn) frameBytesMax() int {
	if n := int(c.hello.Limits.FrameBytesMax); n > 0 {
		return n
	}
	return protocol.FrameBytesDefault
}

func (c *wconn) readFrame(limit int) (protocol.Frame, error) {
	f, buf, err := protocol.ReadFrame(c.br, limit, c.buf)
	c.buf = buf
	return f, err
}

// next reads and decodes one frame, answering a server PING itself (the PING
// is still returned, so callers see every frame and can act between reads).
// Silence for three heartbeats is a dead connection.
func (c *wconn) next() (protocol.FrameHeader, protocol.Body, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(3 * time.Duration(c.hello.HeartbeatMs) * time.Millisecond))
	f, err := c.readFrame(c.frameBytesMax())
	if err != nil {
		return protocol.FrameHeader{}, nil, err
	}
	body, err := protocol.Decode(f)
	if err != nil {
		return f.FrameHeader, nil, err
	}
	if f.Op == protocol.OpPing {
		if err := c.write(0, f.RequestID, &protocol.Pong{}); err != nil {
			return f.FrameHeader, nil, err
		}
	}
	return f.FrameHeader, body, nil
}

// send writes a request with a fresh request id and returns the id.
func (c *wconn) send(flags uint16, body protocol.Body) (uint64, error) {
	id := c.req.Add(1)
	return id, c.write(flags, id, body)
}

func (c *wconn) write(flags uint16, id uint64, body protocol.Body) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wbuf = protocol.AppendFrame(c.wbuf[:0], flags, id, body)
	_ = c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err := c.nc.Write(c.wbuf)
	return err
}

// heartbeat sends a PING every half heartbeat until stop is closed or a write
// fails; it closes the connection on failure so the reader notices.
func (c *wconn) heartbeat(stop <-chan struct{}) {
	t := time.NewTicker(time.Duration(c.hello.HeartbeatMs) * time.Millisecond / 2)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if _, err := c.send(0, &protocol.Ping{}); err != nil {
				c.nc.Close()
				return
			}
		}
	}
}

func (c *wconn) close() { c.nc.Close() }

// backoff waits before reconnect attempt n (bounded exponential, 25 ms to
// 1 s) or until ctx ends; it returns false when ctx ended.
func backoff(ctx context.Context, n int) bool {
	d := 25 * time.Millisecond << min(n, 6)
	d = min(d, time.Second)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
