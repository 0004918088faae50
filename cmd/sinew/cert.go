package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/sinewmq/sinew/internal/tlsconf"
)

const certUsage = `usage: sinew cert generate [--dir D] [--hosts h1,h2] [--days N] [--client-name N] [--force]

Makes a self-signed CA, a server certificate (for localhost, 127.0.0.1, ::1 and
--hosts) and a client certificate (for mutual TLS), all ECDSA P-256, and
writes them to --dir with mode 0600:

  ca.pem                      the CA certificate (clients: --tls-ca; broker: tls.client_ca_file)
  server.pem, server-key.pem  tls.cert_file and tls.key_file (and admin_tls.*)
  client.pem, client-key.pem  --tls-cert and --tls-key

The CA's private key is not written: these files cannot sign more
certificates; run the command again (with --force) for a new set. They are
for trying TLS out; production brokers use certificates from their own CA.
Existing files are not overwritten without --force. The configuration lines to
use are printed on stdout.
`

func init() {
	commands["cert"] = command{
		summary: "generate a self-signed CA, server and client certificates for trying TLS",
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
	force := fs.Bool("force", false, "overwrite existing files")
	fs.Usage = func() {
		fmt.Fprint(stderr, certUsage+"\nflags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	var hs []string
	for _, h := range strings.Split(*hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hs = append(hs, h)
		}
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	g, err := tlsconf.Generate(tlsconf.GenerateOptions{Dir: abs, Hosts: hs, Days: *days, ClientName: *clientName, Force: *force, Now: time.Now()})
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
	return nil
}
