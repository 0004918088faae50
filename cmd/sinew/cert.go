package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sinewmq/sinew/internal/clusternode"
	"github.com/sinewmq/sinew/internal/nodeid"
	"github.com/sinewmq/sinew/internal/tlsconf"
	"github.com/sinewmq/sinew/internal/vfs"
)

const certUsage = `usage: sinew cert generate [--dir D] [--hosts h1,h2] [--days N] [--client-name N]
                           [--peer-data-dirs d1,d2 | --peer-ids id1,id2] [--force]

Makes a self-signed CA, a server certificate (for localhost, 127.0.0.1, ::1 and
--hosts) and a client certificate (for mutual TLS), all ECDSA P-256, and
writes them to --dir with mode 0600:

  ca.pem                      the CA certificate (clients: --tls-ca; broker: tls.client_ca_file)
  server.pem, server-key.pem  tls.cert_file and tls.key_file (and admin_tls.*)
  client.pem, client-key.pem  --tls-cert and --tls-key

With --peer-data-dirs or --peer-ids it also makes the cluster's peer
certificates, from a second CA that signs nothing else, one per node, each
naming its node id in the URI SAN sinew-node://sinew/<node id> (a node's
peers accept it only as that node):

  peer-ca.pem                           cluster.peer_tls_ca_file of every node
  peer-<id>.pem, peer-<id>-key.pem      cluster.peer_tls_cert_file and _key_file of node <id>

--peer-data-dirs names the nodes' data directories: each one's node id is
read from its node_id file, which is created (with the directory) when
missing, as sinew serve would on its first start. --peer-ids names node ids
(32 lowercase hex digits: sinew admin nodes, or the node_id file).

The CAs' private keys are not written: these files cannot sign more
certificates; run the command again (with --force) for a new set. They are
for trying TLS out; production brokers use certificates from their own CA.
Existing files are not overwritten without --force. The configuration lines to
use are printed on stdout.
`

func init() {
	commands["cert"] = command{
		summary: "generate self-signed CAs, server, client and cluster peer certificates for trying TLS",
		run:     runCert,
	}
}

func runCert(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "generate" {
		fmt.Fprint(stderr, certUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			return flag.ErrHelp
		}
		return fmt.Errorf("%w: want sinew cert generate", errUsage)
	}
	fs := newFlagSet("cert generate", stderr)
	dir := fs.String("dir", "./sinew-certs", "directory to write the files to (created 0700 when missing)")
	hosts := fs.String("hosts", "", "extra server names, comma-separated DNS names or IP addresses")
	days := fs.Int("days", 365, "validity of every certificate in days")
	clientName := fs.String("client-name", "sinew-client", "the client certificate's common name and DNS SAN (the user under tls.client_cert_user)")
	peerDirs := fs.String("peer-data-dirs", "", "cluster nodes' data directories, comma-separated: a peer certificate for each one's node id (node_id file, created when missing)")
	peerIDs := fs.String("peer-ids", "", "cluster node ids, comma-separated: a peer certificate for each")
	force := fs.Bool("force", false, "overwrite existing files")
	fs.Usage = func() {
		fmt.Fprint(stderr, certUsage+"\nflags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if *peerDirs != "" && *peerIDs != "" {
		return fmt.Errorf("%w: --peer-data-dirs and --peer-ids: give one of them", errUsage)
	}
	hs := splitList(*hosts)
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	ids := splitList(*peerIDs)
	dirOf := map[string]string{}
	for _, d := range splitList(*peerDirs) {
		id, err := peerNodeID(d)
		if err != nil {
			return err
		}
		if prev, ok := dirOf[id]; ok {
			return fmt.Errorf("%w: --peer-data-dirs %s and %s hold the same node id %s (one a copy of the other?); each node needs its own data directory", errUsage, prev, d, id)
		}
		dirOf[id] = d
		ids = append(ids, id)
	}
	g, err := tlsconf.Generate(tlsconf.GenerateOptions{Dir: abs, Hosts: hs, Days: *days, ClientName: *clientName, Force: *force, Now: time.Now(),
		PeerNodeIDs: ids, PeerCluster: clusternode.RaftClusterID, ValidPeerNodeID: nodeid.Check})
	if errors.Is(err, tlsconf.ErrExists) {
		return err
	}
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	fmt.Fprintf(stdout, `# Wrote %s (mode 0600). Broker configuration (sinew.toml):
[tls]
cert_file = %q
key_file = %q
# Mutual TLS: ask clients for a certificate signed by this CA.
client_ca_file = %q
client_auth = "require"
# client_cert_user = "cn"   # the certificate's CN (%s) is then the user

[admin_tls]
cert_file = %q
key_file = %q

# Clients:
#   sinew publish --tls-ca %s --tls-cert %s --tls-key %s --topic jobs
#   sinew admin queues --tls-ca %s --tls-cert %s --tls-key %s
`, abs, g.ServerCert, g.ServerKey, g.CA, *clientName, g.ServerCert, g.ServerKey,
		g.CA, g.ClientCert, g.ClientKey, g.CA, g.ClientCert, g.ClientKey)
	if len(g.Peers) == 0 {
		fmt.Fprintln(stdout, "\n# A cluster's peer certificates: run again with --peer-data-dirs or --peer-ids.")
		return nil
	}
	fmt.Fprintf(stdout, "\n# Cluster peer TLS: each node's own certificate, all from the peer CA %s.\n", g.PeerCA)
	for _, p := range g.Peers {
		where := ""
		if d, ok := dirOf[p.NodeID]; ok {
			where = " (data directory " + d + ")"
		}
		fmt.Fprintf(stdout, `# Node %s%s, in its [cluster] section:
#   peer_tls_cert_file = %q
#   peer_tls_key_file = %q
#   peer_tls_ca_file = %q
# or: --cluster-peer-tls-cert-file %s --cluster-peer-tls-key-file %s --cluster-peer-tls-ca-file %s
`, p.NodeID, where, p.Cert, p.Key, g.PeerCA, p.Cert, p.Key, g.PeerCA)
	}
	fmt.Fprintln(stdout, "# With users or auth.tokens a cluster also needs cluster.gossip_key_file: (umask 077; head -c 32 /dev/urandom | base64 > gossip.key)")
	return nil
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// peerNodeID returns the node id of data directory dir, creating the
// directory and its node_id file when missing, as serve's first start
// would: the certificate can then be made before the node first runs.
func peerNodeID(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("--peer-data-dirs %s: %w", dir, err)
	}
	id, err := nodeid.Load(vfs.OS(), dir, nil)
	if err != nil {
		return "", fmt.Errorf("--peer-data-dirs %s: %w", dir, err)
	}
	return id, nil
}
