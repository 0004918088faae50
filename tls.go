package sinew

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
)

// tlsFileBytesMax bounds one PEM file LoadTLSConfig reads.
const tlsFileBytesMax = 4 << 20

// LoadTLSConfig builds a configuration for WithTLS from PEM files. caFile,
// when set, holds the CAs that verify the broker's certificate, in place of
// the system roots (for a private CA such as the one sinew cert generate
// makes). certFile and keyFile, when set (both or neither), are the client
// certificate for a broker that asks for one (mutual TLS). TLS 1.2 is the
// minimum.
func LoadTLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		b, err := readBounded(caFile)
		if err != nil {
			return nil, fmt.Errorf("sinew: TLS CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("sinew: TLS CA file %s: no PEM certificate found", caFile)
		}
		cfg.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("sinew: a TLS client certificate needs both its certificate and its key file")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("sinew: TLS client certificate %s with key %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, tlsFileBytesMax+1))
	if err != nil {
		return nil, err
	}
	if len(b) > tlsFileBytesMax {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, tlsFileBytesMax)
	}
	return b, nil
}
