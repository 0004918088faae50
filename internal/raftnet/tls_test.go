package raftnet

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/multiraft"
	"github.com/sinewmq/sinew/internal/tlsconf"
)

// peerTLS issues a node certificate from is and returns the node's
// PeerTLS trusting is.
func peerTLS(t *testing.T, is *tlsconf.Issuer, name string) *PeerTLS {
	t.Helper()
	now := time.Now()
	certPEM, keyPEM, err := is.Issue(tlsconf.Leaf{CommonName: name, Hosts: []string{"127.0.0.1"}, Server: true, Client: true,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(is.CertPEM) {
		t.Fatal("CA not parsed")
	}
	return &PeerTLS{Certificate: cert, CAs: pool}
}

func issuer(t *testing.T, name string) *tlsconf.Issuer {
	t.Helper()
	now := time.Now()
	is, err := tlsconf.NewIssuer(name, now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return is
}

func withTLS(p *PeerTLS) func(*Config) { return func(c *Config) { c.TLS = p } }

// TestTLSPeersDeliver: two nodes with certificates of the cluster's CA
// talk over mutual TLS.
func TestTLSPeersDeliver(t *testing.T) {
	ca := issuer(t, "cluster CA")
	a := start(t, 1, "c", withTLS(peerTLS(t, ca, "node a")))
	b := start(t, 2, "c", withTLS(peerTLS(t, ca, "node b")))
	a.t.AddPeer(2, b.addr())
	await(t, b, "a batch over TLS", func() { a.t.Send(2, []multiraft.Envelope{msg(1, 1, 2, 5)}) },
		func(g got) bool { return g.from == 1 && len(g.batch) == 1 && g.batch[0].Msg.Index == 5 })
}

// TestTLSRefusesStrangers: a node whose certificate another CA issued, and
// a node without TLS, are refused, and nothing of theirs is delivered.
func TestTLSRefusesStrangers(t *testing.T) {
	ca, other := issuer(t, "cluster CA"), issuer(t, "another CA")
	b := start(t, 2, "c", withTLS(peerTLS(t, ca, "node b")))
	for _, tc := range []struct {
		name string
		opts []func(*Config)
	}{
		{"a certificate of another CA", []func(*Config){withTLS(peerTLS(t, other, "stranger"))}},
		{"no TLS", nil},
	} {
		a := start(t, 1, "c", tc.opts...)
		a.t.AddPeer(2, b.addr())
		before := b.t.Stats().Refused
		deadline := time.Now().Add(waitMax)
		for b.t.Stats().Refused < before+2 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not refused within %v; stats %+v", tc.name, waitMax, b.t.Stats())
			}
			a.t.Send(2, []multiraft.Envelope{msg(1, 1, 2, 9)})
			select {
			case g := <-b.rec.ch:
				t.Fatalf("%s: delivered %+v", tc.name, g)
			case <-time.After(20 * time.Millisecond):
			}
		}
		a.t.Close()
	}
	if b.t.Stats().Delivered != 0 {
		t.Fatalf("delivered %d batches from strangers", b.t.Stats().Delivered)
	}
	if !strings.Contains(b.log.String(), "tls") {
		t.Errorf("the refusals do not say TLS: %s", b.log.String())
	}
}

// TestTLSDialerRefusesAStrangeAcceptor: a node of the cluster does not
// send to an acceptor whose certificate another CA issued.
func TestTLSDialerRefusesAStrangeAcceptor(t *testing.T) {
	ca, other := issuer(t, "cluster CA"), issuer(t, "another CA")
	a := start(t, 1, "c", withTLS(peerTLS(t, ca, "node a")))
	b := start(t, 2, "c", withTLS(peerTLS(t, other, "stranger")))
	a.t.AddPeer(2, b.addr())
	deadline := time.Now().Add(waitMax)
	for !strings.Contains(a.log.String(), "refusing peer") {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal logged within %v: %s", waitMax, a.log.String())
		}
		a.t.Send(2, []multiraft.Envelope{msg(1, 1, 2, 9)})
		select {
		case g := <-b.rec.ch:
			t.Fatalf("delivered %+v to a stranger", g)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
