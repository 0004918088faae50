package tlsconf

import (
	"crypto/tls"
	"net"
	"testing"
	"time"
)

// BenchmarkHandshake measures one client connect through Listener on
// loopback: TCP, the sniff and a full TLS handshake (no session
// resumption), with and without a client certificate, beside a plain TCP
// connect. It sizes what a reconnect storm costs the broker.
func BenchmarkHandshake(b *testing.B) {
	s := generate(b, b.TempDir(), false)
	cli, err := tls.LoadX509KeyPair(s.gen.ClientCert, s.gen.ClientKey)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		tls  bool
		mtls bool
	}{{"plain", false, false}, {"tls", true, false}, {"mtls", true, true}} {
		b.Run(bc.name, func(b *testing.B) {
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			f := serverFiles(s)
			if bc.mtls {
				f.ClientCAFile = s.gen.CA
			}
			r, err := NewReloader(f, Options{})
			if err != nil {
				b.Fatal(err)
			}
			var ln net.Listener = inner
			if bc.tls {
				ln = NewListener(inner, r.ServerConfig(), ListenerOptions{})
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					nc, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer nc.Close()
						nc.SetDeadline(time.Now().Add(10 * time.Second))
						buf := make([]byte, 1)
						if _, err := nc.Read(buf); err == nil {
							nc.Write(buf)
						}
					}()
				}
			}()
			ccfg := &tls.Config{RootCAs: s.pool, ServerName: "localhost", ClientSessionCache: nil}
			if bc.mtls {
				ccfg.Certificates = []tls.Certificate{cli}
			}
			addr := ln.Addr().String()
			buf := make([]byte, 1)
			for b.Loop() {
				var c net.Conn
				c, err = net.Dial("tcp", addr)
				if err == nil && bc.tls {
					c = tls.Client(c, ccfg)
				}
				if err == nil {
					// One byte each way: the server has handshook and
					// verified the client (under TLS 1.3 it does so after
					// the client's Handshake returns).
					if _, err = c.Write(buf); err == nil {
						_, err = c.Read(buf)
					}
					c.Close()
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			ln.Close()
			<-done
		})
	}
}
