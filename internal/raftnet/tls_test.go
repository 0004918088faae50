package raftnet

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/multiraft"
	"github.com/sinewmq/sinew/internal/tlsconf"
)

// testRaftID is the tests' node naming: a node id is its raft id in
// decimal.
func testRaftID(id string) (uint64, error) {
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("not a test node id")
	}
	return n, nil
}

// leafOf issues a certificate from is described by l (validity filled in)
// and returns it as a tls.Certificate.
func leafOf(t *testing.T, is *tlsconf.Issuer, l tlsconf.Leaf) tls.Certificate {
	t.Helper()
	now := time.Now()
	l.NotBefore, l.NotAfter = now.Add(-time.Hour), now.Add(time.Hour)
	certPEM, keyPEM, err := is.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// peerLeaf describes a peer certificate naming node id of cluster c.
func peerLeaf(id uint64) tlsconf.Leaf {
	return tlsconf.Leaf{CommonName: "node " + strconv.FormatUint(id, 10), Server: true, Client: true,
		URIs: []*url.URL{tlsconf.PeerURI("c", strconv.FormatUint(id, 10))}}
}

func poolOf(t *testing.T, is *tlsconf.Issuer) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(is.CertPEM) {
		t.Fatal("CA not parsed")
	}
	return pool
}

// peerTLS issues node id's peer certificate (cluster "c") from is and
// returns the node's PeerTLS trusting is.
func peerTLS(t *testing.T, is *tlsconf.Issuer, id uint64) *PeerTLS {
	t.Helper()
	return &PeerTLS{Certificate: leafOf(t, is, peerLeaf(id)), CAs: poolOf(t, is), RaftID: testRaftID}
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

// TestTLSPeersDeliver: two nodes with peer certificates of the cluster's
// CA talk over mutual TLS.
func TestTLSPeersDeliver(t *testing.T) {
	ca := issuer(t, "cluster CA")
	a := start(t, 1, "c", withTLS(peerTLS(t, ca, 1)))
	b := start(t, 2, "c", withTLS(peerTLS(t, ca, 2)))
	a.t.AddPeer(2, b.addr())
	await(t, b, "a batch over TLS", func() { a.t.Send(2, []multiraft.Envelope{msg(1, 1, 2, 5)}) },
		func(g got) bool { return g.from == 1 && len(g.batch) == 1 && g.batch[0].Msg.Index == 5 })
}

// TestTLSRefusesStrangers: a node whose certificate another CA issued, and
// a node without TLS, are refused, and nothing of theirs is delivered.
func TestTLSRefusesStrangers(t *testing.T) {
	ca, other := issuer(t, "cluster CA"), issuer(t, "another CA")
	b := start(t, 2, "c", withTLS(peerTLS(t, ca, 2)))
	for _, tc := range []struct {
		name string
		opts []func(*Config)
	}{
		{"a certificate of another CA", []func(*Config){withTLS(peerTLS(t, other, 1))}},
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
	a := start(t, 1, "c", withTLS(peerTLS(t, ca, 1)))
	b := start(t, 2, "c", withTLS(peerTLS(t, other, 2)))
	a.t.AddPeer(2, b.addr())
	awaitRefusal(t, a, b, 2, "refusing peer")
}

// awaitRefusal sends from a to peer id (served by b) until a's log holds
// want, failing if b is delivered anything.
func awaitRefusal(t *testing.T, a, b *tnode, id uint64, want string) {
	t.Helper()
	deadline := time.Now().Add(waitMax)
	for !strings.Contains(a.log.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q logged within %v: %s", want, waitMax, a.log.String())
		}
		a.t.Send(id, []multiraft.Envelope{msg(1, 1, id, 9)})
		select {
		case g := <-b.rec.ch:
			t.Fatalf("delivered %+v to a peer that is not node %d", g, id)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// impersonate dials acceptor b over TLS with cert, says hello as node
// claim of cluster "c" and writes a heartbeat batch, as a process holding
// a certificate of the cluster's CA could; it returns once b has refused
// one more connection and logged a refusal saying want, and fails if b
// delivered anything.
func impersonate(t *testing.T, b *tnode, cert tls.Certificate, claim uint64, want string) {
	t.Helper()
	before, logged := b.t.Stats().Refused, strings.Count(b.log.String(), want)
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: waitMax}, "tcp", b.addr(), &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		InsecureSkipVerify: true, // the attacker does not care who b is
	})
	if err == nil {
		defer c.Close()
		payloads, _ := encodeBatch([]multiraft.Envelope{msg(1, claim, 2, 7)}, 1<<20)
		c.SetDeadline(time.Now().Add(waitMax))
		if _, err = c.Write(frame(hello(claim, "c"))); err == nil {
			_, err = c.Write(frame(payloads[0]))
		}
		if err == nil {
			// The acceptor answers a hello it takes with its own; a
			// refused one gets an alert or EOF.
			if payload, rerr := readFrame(c, clusterIDMax+32, nil); rerr == nil {
				t.Fatalf("the acceptor answered the hello: %q", payload)
			}
		}
	}
	deadline := time.Now().Add(waitMax)
	for b.t.Stats().Refused <= before || strings.Count(b.log.String(), want) <= logged {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal saying %q within %v; stats %+v; log %s", want, waitMax, b.t.Stats(), b.log.String())
		}
		time.Sleep(5 * time.Millisecond) // polling the acceptor's counter and log
	}
	select {
	case g := <-b.rec.ch:
		t.Fatalf("delivered %+v", g)
	default:
	}
	if d := b.t.Stats().Delivered; d != 0 {
		t.Fatalf("delivered %d batches", d)
	}
}

// TestTLSRefusesCertificatesThatNameNoNode: certificates the cluster's CA
// issued for something else than a node (a client certificate; one with
// both usages but no node name; one naming a node of another cluster; one
// naming two nodes) are refused at the acceptor whatever node their
// hello claims, and the refusal says why.
func TestTLSRefusesCertificatesThatNameNoNode(t *testing.T) {
	ca := issuer(t, "cluster CA")
	b := start(t, 2, "c", withTLS(peerTLS(t, ca, 2)))
	for _, tc := range []struct {
		name string
		leaf tlsconf.Leaf
		want string
	}{
		{"a client certificate", tlsconf.Leaf{CommonName: "sinew-client", Hosts: []string{"sinew-client"}, Client: true}, "names no node of cluster"},
		{"both usages, no node name", tlsconf.Leaf{CommonName: "sinew-server", Hosts: []string{"127.0.0.1"}, Server: true, Client: true}, "names no node of cluster"},
		{"a node of another cluster", tlsconf.Leaf{CommonName: "x", Client: true, URIs: []*url.URL{tlsconf.PeerURI("other", "1")}}, "names no node of cluster"},
		{"two nodes", tlsconf.Leaf{CommonName: "x", Client: true, URIs: []*url.URL{tlsconf.PeerURI("c", "1"), tlsconf.PeerURI("c", "3")}}, "names 2 nodes"},
		{"a node id that is not one", tlsconf.Leaf{CommonName: "x", Client: true, URIs: []*url.URL{tlsconf.PeerURI("c", "node-one")}}, "not a test node id"},
	} {
		impersonate(t, b, leafOf(t, ca, tc.leaf), 1, tc.want)
	}
}

// TestTLSRefusesAHelloForAnotherNode: node 1's own peer certificate does
// not let it speak as node 3.
func TestTLSRefusesAHelloForAnotherNode(t *testing.T) {
	ca := issuer(t, "cluster CA")
	b := start(t, 2, "c", withTLS(peerTLS(t, ca, 2)))
	impersonate(t, b, leafOf(t, ca, peerLeaf(1)), 3, "the hello claims raft id 3, the certificate names node 1")
	// The same certificate with its own id is a peer.
	a := start(t, 1, "c", withTLS(peerTLS(t, ca, 1)))
	a.t.AddPeer(2, b.addr())
	await(t, b, "a batch from node 1", func() { a.t.Send(2, []multiraft.Envelope{msg(1, 1, 2, 5)}) },
		func(g got) bool { return g.from == 1 })
}

// TestTLSDialerRefusesAnotherNode: a node that dials node 2 does not send
// to an acceptor whose certificate names node 3 (node 2's address taken
// over, or gossip pointing elsewhere).
func TestTLSDialerRefusesAnotherNode(t *testing.T) {
	ca := issuer(t, "cluster CA")
	a := start(t, 1, "c", withTLS(peerTLS(t, ca, 1)))
	b := start(t, 3, "c", withTLS(peerTLS(t, ca, 3)))
	a.t.AddPeer(2, b.addr())
	awaitRefusal(t, a, b, 2, "presents the certificate of node 3 (raft id 3), want raft id 2")
}

// TestNewRefusesACertificateOfAnotherNode: a transport whose own
// certificate does not name its node does not start.
func TestNewRefusesACertificateOfAnotherNode(t *testing.T) {
	ca := issuer(t, "cluster CA")
	for _, tc := range []struct {
		name string
		tls  *PeerTLS
		want string
	}{
		{"another node's", peerTLS(t, ca, 2), "names node 2"},
		{"no node name", &PeerTLS{Certificate: leafOf(t, ca, tlsconf.Leaf{CommonName: "s", Server: true, Client: true}), CAs: poolOf(t, ca), RaftID: testRaftID}, "names no node of cluster"},
		{"no RaftID", &PeerTLS{Certificate: leafOf(t, ca, peerLeaf(1)), CAs: poolOf(t, ca)}, "RaftID"},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		_, err = New(Config{ClusterID: "c", NodeID: 1, Listener: ln, Receiver: &recorder{}, TLS: tc.tls})
		ln.Close()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one saying %q", tc.name, err, tc.want)
		}
		if tc.want != "RaftID" && !errors.Is(err, ErrPeerIdentity) {
			t.Errorf("%s: err %v is not ErrPeerIdentity", tc.name, err)
		}
	}
}

// TestPeerNodeID: the URI SAN scheme, read back.
func TestPeerNodeID(t *testing.T) {
	ca := issuer(t, "cluster CA")
	parse := func(c tls.Certificate) *x509.Certificate {
		x, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	x := parse(leafOf(t, ca, tlsconf.Leaf{CommonName: "n", URIs: []*url.URL{
		{Scheme: "https", Host: "c", Path: "/9"}, tlsconf.PeerURI("other", "8"), tlsconf.PeerURI("c", "7")}}))
	if id, err := tlsconf.PeerNodeID(x, "c"); err != nil || id != "7" {
		t.Fatalf("PeerNodeID = %q, %v; want 7", id, err)
	}
	if u := tlsconf.PeerURI("sinew", "0123abcd").String(); u != "sinew-node://sinew/0123abcd" {
		t.Fatalf("PeerURI = %s", u)
	}
	bad := parse(leafOf(t, ca, tlsconf.Leaf{CommonName: "n", URIs: []*url.URL{{Scheme: tlsconf.PeerURIScheme, Host: "c", Path: "/a/b"}}}))
	if _, err := tlsconf.PeerNodeID(bad, "c"); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("a path of two segments: %v", err)
	}
}
