package admin

import (
	"errors"
	"net"
	"testing"
	"testing/synctest"
)

// pipeListener hands out the server ends of net.Pipe pairs.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
}

func (p *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	case <-p.closed:
		return nil, net.ErrClosed
	}
}
func (p *pipeListener) Close() error   { close(p.closed); return nil }
func (p *pipeListener) Addr() net.Addr { return &net.TCPAddr{} }

// At the bound Accept waits; closing a connection (twice counts once) lets
// the next one in; Close ends a waiting Accept.
func TestLimitListener(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pl := &pipeListener{conns: make(chan net.Conn, 8), closed: make(chan struct{})}
		for range 4 {
			a, b := net.Pipe()
			defer a.Close()
			pl.conns <- b
		}
		ln := LimitListener(pl, 2)
		c1, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ln.Accept(); err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 2)
		go func() { _, err := ln.Accept(); got <- err }()
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("a third connection accepted at the bound of 2")
		default:
		}
		c1.Close()
		c1.Close()
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		go func() { _, err := ln.Accept(); got <- err }()
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("a closed connection's slot was freed twice")
		default:
		}
		ln.Close()
		if err := <-got; !errors.Is(err, net.ErrClosed) {
			t.Fatalf("waiting Accept after Close: %v", err)
		}
	})
}
