package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"os"

	"github.com/sinewmq/sinew"
)

// tlsFlags are the TLS flags of every command that connects to a broker:
// the client commands (publish, consume, queue, bench) and the admin ones.
type tlsFlags struct {
	on            *bool
	ca, cert, key *string
}

func addTLSFlags(fs *flag.FlagSet) tlsFlags {
	return tlsFlags{
		on: fs.Bool("tls", os.Getenv("SINEW_TLS") == "1",
			"connect with TLS, verifying the broker against the system roots or --tls-ca (env SINEW_TLS=1); implied by --tls-ca and --tls-cert"),
		ca:   fs.String("tls-ca", os.Getenv("SINEW_TLS_CA"), "PEM `file` of the CA that signed the broker's certificate, in place of the system roots (env SINEW_TLS_CA)"),
		cert: fs.String("tls-cert", os.Getenv("SINEW_TLS_CERT"), "PEM `file` of the client certificate, for a broker that asks for one (mutual TLS; env SINEW_TLS_CERT)"),
		key:  fs.String("tls-key", os.Getenv("SINEW_TLS_KEY"), "PEM `file` of the --tls-cert private key (env SINEW_TLS_KEY)"),
	}
}

// enabled reports whether the flags ask for TLS.
func (f tlsFlags) enabled() bool { return *f.on || *f.ca != "" || *f.cert != "" || *f.key != "" }

// config returns the client TLS configuration, or nil when TLS is off.
func (f tlsFlags) config() (*tls.Config, error) {
	if !f.enabled() {
		return nil, nil
	}
	if (*f.cert == "") != (*f.key == "") {
		return nil, fmt.Errorf("%w: --tls-cert and --tls-key go together", errUsage)
	}
	return sinew.LoadTLSConfig(*f.ca, *f.cert, *f.key)
}
