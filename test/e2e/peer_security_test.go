package e2e_test

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/controller"
	"github.com/sinewmq/sinew/internal/nodeid"
	"github.com/sinewmq/sinew/internal/tlsconf"
	"github.com/sinewmq/sinew/internal/vfs"
)

// The raft transport's wire format (internal/raftnet's package doc),
// written here from the documentation as a process without the cluster's
// code would: a frame is length u32 BE | CRC-32C u32 BE | payload.
func rawFrame(payload []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(payload)))
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(payload, crc32.MakeTable(crc32.Castagnoli)))
	return append(b, payload...)
}

// rawHello is the dialler's hello claiming raft id id in the cluster
// sinew serve uses ("sinew").
func rawHello(id uint64) []byte {
	b := append([]byte("SNRN"), 1)
	b = binary.AppendUvarint(b, id)
	b = binary.AppendUvarint(b, uint64(len("sinew")))
	return append(b, "sinew"...)
}

// rawBatch is one batch of msgs for group.
func rawBatch(t *testing.T, group uint64, msgs ...raftpb.Message) []byte {
	t.Helper()
	b := binary.AppendUvarint(nil, uint64(len(msgs)))
	for _, m := range msgs {
		d, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		b = binary.AppendUvarint(b, group)
		b = binary.AppendUvarint(b, uint64(len(d)))
		b = append(b, d...)
	}
	return b
}

// writeGossipKey writes a random gossip key into dir and returns its path.
func writeGossipKey(t *testing.T, dir string) string {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "gossip.key")
	if err := os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(key)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// peerFlags are the serve flags of node id's peer certificate as sinew
// cert generate wrote it into certs, with caFile as the peer CA.
func peerFlags(certs, id, caFile string) []string {
	return []string{"--cluster-peer-tls-cert-file", filepath.Join(certs, tlsconf.PeerCertFile(id)),
		"--cluster-peer-tls-key-file", filepath.Join(certs, tlsconf.PeerKeyFile(id)), "--cluster-peer-tls-ca-file", caFile}
}

// Three nodes run with the certificates of `sinew cert generate
// --peer-data-dirs`, their peer CA file a bundle that also holds the client
// CA (as an operator trusting one bundle for both would have; the broker
// warns about it). A process holding the client certificate, and one
// holding node 2's own peer certificate, connect to the controller
// leader's peer port, say hello as another node and send heartbeats of a
// far higher term: both are refused at the handshake with the reason
// logged, never answered, and the controller keeps its leader and term.
func TestClusterPeerPortRefusesImpostors(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	base := t.TempDir()
	certs := filepath.Join(base, "certs")
	dirs := []string{filepath.Join(base, "d1"), filepath.Join(base, "d2"), filepath.Join(base, "d3")}
	if out, err := exec.Command(bin, "cert", "generate", "--dir", certs, "--peer-data-dirs", strings.Join(dirs, ",")).CombinedOutput(); err != nil {
		t.Fatalf("sinew cert generate: %v\n%s", err, out)
	}
	var ids []string
	for _, d := range dirs {
		id, err := nodeid.Load(vfs.OS(), d, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	peerCA, err := os.ReadFile(filepath.Join(certs, tlsconf.PeerCAFile))
	if err != nil {
		t.Fatal(err)
	}
	clientCA, err := os.ReadFile(filepath.Join(certs, tlsconf.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(base, "peer-and-client-ca.pem")
	if err := os.WriteFile(bundle, append(peerCA, clientCA...), 0o600); err != nil {
		t.Fatal(err)
	}
	key := writeGossipKey(t, base)
	start := func(i int, seeds ...string) *clusterChild {
		args := []string{"--cluster", "--cluster-profile", "lan", "--cluster-gossip-listen", "127.0.0.1:0",
			"--cluster-peer-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--cluster-gossip-key-file", key,
			"--tls-cert-file", filepath.Join(certs, tlsconf.ServerCertFile), "--tls-key-file", filepath.Join(certs, tlsconf.ServerKeyFile),
			"--tls-client-ca-file", filepath.Join(certs, tlsconf.CAFile)}
		args = append(args, peerFlags(certs, ids[i], bundle)...)
		if len(seeds) > 0 {
			args = append(args, "--cluster-seeds", strings.Join(seeds, ","))
		}
		c := startChildArgs(t, bin, dirs[i], args...)
		return &clusterChild{child: c, dir: dirs[i],
			admin:  logField(t, c, "msg=serving", "admin_listen"),
			gossip: logField(t, c, "cluster membership started", "gossip_addr")}
	}
	n1 := start(0)
	nodes := []*clusterChild{n1, start(1, n1.gossip), start(2, n1.gossip)}
	for _, c := range nodes {
		awaitNodes(t, c, "three voters over peer TLS", func(v nodesView) bool { return controllerAgrees(v, ids, nil, ids, nil) })
	}
	if !strings.Contains(n1.log(), "the peer CA is also a client CA") || !strings.Contains(n1.log(), "tls.client_ca_file=") {
		t.Errorf("no warning that the peer CA is also the client CA:\n%s", n1.log())
	}

	v := nodesOf(t, n1.admin).Controller
	leader, term := v.Leader, v.Term
	var target *clusterChild
	var targetAddr string
	for i, c := range nodes {
		if ids[i] == leader {
			target = c
		}
	}
	for _, nd := range v.Nodes {
		if nd.ID == leader {
			targetAddr = nd.PeerAddr
		}
	}
	if target == nil || targetAddr == "" {
		t.Fatalf("leader %s not among the nodes: %+v", leader, v)
	}
	var others []string // the followers' node ids
	for _, id := range ids {
		if id != leader {
			others = append(others, id)
		}
	}
	raftID := func(id string) uint64 {
		r, err := controller.RaftIDOf(id)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	leaderRID := raftID(leader)
	loadCert := func(cert, key string) tls.Certificate {
		c, err := tls.LoadX509KeyPair(filepath.Join(certs, cert), filepath.Join(certs, key))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	for _, tc := range []struct {
		name  string
		cert  tls.Certificate
		claim string // the node id the hello claims
	}{
		{"the client certificate", loadCert(tlsconf.ClientCertFile, tlsconf.ClientKeyFile), others[0]},
		{"a follower's peer certificate claiming the other follower", loadCert(tlsconf.PeerCertFile(others[0]), tlsconf.PeerKeyFile(others[0])), others[1]},
	} {
		claim := raftID(tc.claim)
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: safetyTimeout}, "tcp", targetAddr, &tls.Config{
			MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{tc.cert},
			InsecureSkipVerify: true, // an impostor does not check whom it talks to
		})
		if err == nil {
			c.SetDeadline(time.Now().Add(safetyTimeout))
			var hb []raftpb.Message
			for range 8 {
				hb = append(hb, raftpb.Message{Type: raftpb.MsgHeartbeat, From: claim, To: leaderRID, Term: term + 4000})
			}
			_, err = c.Write(rawFrame(rawHello(claim)))
			for i := 0; err == nil && i < 4; i++ {
				_, err = c.Write(rawFrame(rawBatch(t, controller.Group, hb...)))
			}
			// A hello the node takes is answered with its own; a refused
			// connection gets a TLS alert or is closed.
			var hdr [8]byte
			if _, rerr := io.ReadFull(c, hdr[:]); rerr == nil {
				t.Errorf("%s: the node answered the hello", tc.name)
			}
			c.Close()
		}
	}

	// Heartbeats that got through would have moved every node to the
	// impostor's term within a round trip; watch the group for a while
	// (a bounded observation, not a wait for a condition), then look for
	// the reasons of the refusals in the leader's log.
	until := time.Now().Add(time.Second)
	for time.Now().Before(until) {
		for _, c := range nodes {
			got := nodesOf(t, c.admin).Controller
			if got.Leader != leader || got.Term != term {
				t.Fatalf("the controller moved: leader %s term %d, was %s term %d", got.Leader, got.Term, leader, term)
			}
		}
		time.Sleep(100 * time.Millisecond) // sampling the controller's view
	}
	for _, want := range []string{"names no node of cluster", "the certificate names node " + others[0]} {
		deadline := time.Now().Add(safetyTimeout)
		for !strings.Contains(target.log(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("no refusal saying %q in the leader's log:\n%s", want, target.log())
			}
			time.Sleep(20 * time.Millisecond) // polling a real process's log
		}
	}
	for _, line := range strings.Split(target.log(), "\n") {
		if strings.Contains(line, "refused peer connection") {
			t.Logf("leader's log: %s", line)
		}
	}
}

// A cluster with users or auth.tokens needs the gossip key and peer TLS,
// on loopback too: sinew serve refuses to start without them, naming the
// settings missing and how to make them. With both it starts; without
// users or tokens (the anonymous quick start) it starts without them, and
// refuses to add a user through the admin API.
func TestClusterWithAuthNeedsGossipKeyAndPeerTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	base := t.TempDir()
	key := writeGossipKey(t, base)
	withUsers := func() string {
		dir := t.TempDir()
		users, err := auth.OpenUsers(vfs.OS(), broker.UsersPath(dir))
		if err != nil {
			t.Fatal(err)
		}
		if err := users.Add("alice", "correct horse", auth.Permissions{Publish: []string{"*"}, Consume: []string{"*"}}); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	cluster := []string{"--listen", "127.0.0.1:0", "--admin-listen", "", "--cluster",
		"--cluster-gossip-listen", "127.0.0.1:0", "--cluster-peer-listen", "127.0.0.1:0"}
	for _, tc := range []struct {
		name     string
		dir      string
		args     []string
		want     []string
		wantNone string
	}{
		{"tokens, no key, no peer TLS", t.TempDir(), []string{"--auth-tokens", "0123456789abcdef0123456789abcdef0123"},
			[]string{"auth.tokens are configured", "cluster.gossip_key_file", "cluster.peer_tls_cert_file", "head -c 32 /dev/urandom", "sinew cert generate --peer-data-dirs"}, ""},
		{"users, no key, no peer TLS", withUsers(), nil,
			[]string{"users are configured", "cluster.gossip_key_file", "cluster.peer_tls_cert_file", "on loopback too"}, ""},
		{"users and a key, no peer TLS", withUsers(), []string{"--cluster-gossip-key-file", key},
			[]string{"cluster.peer_tls_cert_file", "sinew cert generate"}, "missing cluster.gossip_key_file"},
	} {
		args := append(append([]string{"serve", "--data-dir", tc.dir}, cluster...), tc.args...)
		cmd := exec.Command(bin, args...)
		done := make(chan struct{})
		var out []byte
		var err error
		go func() { out, err = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
		case <-time.After(safetyTimeout):
			cmd.Process.Kill()
			<-done
			t.Fatalf("%s: serve did not refuse to start; output:\n%s", tc.name, out)
		}
		if err == nil || strings.Contains(string(out), "panic") {
			t.Fatalf("%s: err %v, output:\n%s", tc.name, err, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s: the refusal does not say %q:\n%s", tc.name, w, out)
			}
		}
		if tc.wantNone != "" && strings.Contains(string(out), tc.wantNone) {
			t.Errorf("%s: the refusal says %q:\n%s", tc.name, tc.wantNone, out)
		}
	}

	// Users with a key and peer certificates: it starts, over peer TLS.
	dir := withUsers()
	certs := filepath.Join(base, "certs")
	if out, err := exec.Command(bin, "cert", "generate", "--dir", certs, "--peer-data-dirs", dir).CombinedOutput(); err != nil {
		t.Fatalf("sinew cert generate: %v\n%s", err, out)
	}
	id, err := nodeid.Load(vfs.OS(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := startChildArgs(t, bin, dir, append(append(cluster[4:], "--cluster-gossip-key-file", key),
		peerFlags(certs, id, filepath.Join(certs, tlsconf.PeerCAFile))...)...)
	if on := logField(t, c, "cluster controller started", "peer_tls"); on != "true" {
		t.Fatalf("peer_tls=%s", on)
	}
	// No users, no tokens, loopback: the quick start runs as it did, and
	// refuses to add a first user, which would make its next start fail.
	q := startChildArgs(t, bin, t.TempDir(), append(cluster[4:], "--admin-listen", "127.0.0.1:0")...)
	if on := logField(t, q, "cluster controller started", "peer_tls"); on != "false" {
		t.Fatalf("peer_tls=%s", on)
	}
	admin := logField(t, q, "msg=serving", "admin_listen")
	resp, err := http.Post("http://"+admin+"/api/v1/users", "application/json", strings.NewReader(`{"name":"bob","password":"a password","permissions":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), "no user is added") || !strings.Contains(string(body), "cluster.gossip_key_file") {
		t.Fatalf("adding a user to a cluster node without key and peer TLS: %s %s", resp.Status, body)
	}
}
