package tlsconf

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Issuer is a certificate authority that signs leaf certificates: the CA
// of sinew cert generate, and of tests that need certificates.
type Issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// CertPEM is the CA certificate, for a client CA or root pool file.
	CertPEM []byte
}

// clockSkewMs backdates NotBefore so a peer whose clock is a little behind
// does not reject a certificate made a moment ago.
const clockSkewMs = 5 * 60 * 1000

// NewIssuer makes a self-signed ECDSA P-256 CA named name, valid from now
// (less a few minutes of clock skew) to notAfter.
func NewIssuer(name string, now, notAfter time.Time) (*Issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"Sinew"}},
		NotBefore:             now.Add(-clockSkewMs * time.Millisecond),
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &Issuer{cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Leaf describes one certificate for Issuer.Issue.
type Leaf struct {
	// CommonName is the subject's CN.
	CommonName string
	// Hosts become subject alternative names: IP addresses as IP SANs,
	// anything else as DNS names.
	Hosts []string
	// URIs become URI subject alternative names (a peer certificate's
	// PeerURI).
	URIs []*url.URL
	// Server and Client set the extended key usages.
	Server, Client bool
	// NotBefore and NotAfter bound the validity.
	NotBefore, NotAfter time.Time
}

// Issue makes an ECDSA P-256 key and a certificate for l signed by the CA,
// both PEM encoded.
func (is *Issuer) Issue(l Leaf) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: l.CommonName, Organization: []string{"Sinew"}},
		NotBefore:    l.NotBefore,
		NotAfter:     l.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if l.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if l.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	tmpl.URIs = l.URIs
	for _, h := range l.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, is.cert, &key.PublicKey, is.key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// serialNumber is 128 random bits, as RFC 5280 4.1.2.2 allows up to 20 bytes
// and asks to be unpredictable.
func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}

// DefaultHosts are the server certificate's names besides GenerateOptions.Hosts.
var DefaultHosts = []string{"localhost", "127.0.0.1", "::1"}

// The files Generate writes, in GenerateOptions.Dir.
const (
	CAFile         = "ca.pem"
	ServerCertFile = "server.pem"
	ServerKeyFile  = "server-key.pem"
	ClientCertFile = "client.pem"
	ClientKeyFile  = "client-key.pem"
	// PeerCAFile is the CA of the peer certificates: another CA than
	// CAFile, so that no client certificate chains to the peers' CA.
	PeerCAFile = "peer-ca.pem"
)

// PeerCertFile and PeerKeyFile are the names of node nodeID's peer
// certificate and key in GenerateOptions.Dir.
func PeerCertFile(nodeID string) string { return "peer-" + nodeID + ".pem" }

// PeerKeyFile is the key of PeerCertFile.
func PeerKeyFile(nodeID string) string { return "peer-" + nodeID + "-key.pem" }

// GenerateOptions are sinew cert generate's inputs.
type GenerateOptions struct {
	// Dir receives the files; it is created (0700) when missing.
	Dir string
	// Hosts are the server certificate's names beyond DefaultHosts.
	Hosts []string
	// Days is every certificate's validity, from Now.
	Days int
	// ClientName is the client certificate's common name (and its DNS SAN,
	// so either tls.client_cert_user mode names it the same).
	ClientName string
	// PeerNodeIDs, when not empty, get one peer certificate each, from a
	// CA of their own (PeerCAFile), naming the node as PeerURI(PeerCluster,
	// id) does; ValidPeerNodeID checks each.
	PeerNodeIDs []string
	// PeerCluster is the cluster id in the peer certificates' URIs.
	PeerCluster string
	// ValidPeerNodeID, when set, refuses a node id that is not one.
	ValidPeerNodeID func(string) error
	// Force overwrites existing files.
	Force bool
	// Now is the start of validity.
	Now time.Time
}

// Generated lists the paths Generate wrote.
type Generated struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
	// PeerCA is empty when no peer certificates were asked for.
	PeerCA string
	// Peers are the peer certificates, in GenerateOptions.PeerNodeIDs order.
	Peers []GeneratedPeer
}

// GeneratedPeer is one node's peer certificate and key.
type GeneratedPeer struct {
	NodeID, Cert, Key string
}

// ErrExists is returned by Generate when a file it would write exists and
// Force is not set.
var ErrExists = errors.New("file exists")

// daysMax keeps NotAfter well inside what x509 encodes (year 9999).
const daysMax = 100 * 365

// Generate makes a CA, a server certificate for localhost and o.Hosts, and
// a client certificate named o.ClientName, and, with o.PeerNodeIDs, a
// second CA and a peer certificate for each node; it writes them to o.Dir,
// every file mode 0600. The CAs' keys are not kept: they are discarded once
// the certificates are signed, so these files cannot mint more. Nothing is
// written when any target exists and o.Force is not set.
func Generate(o GenerateOptions) (Generated, error) {
	if o.Days < 1 || o.Days > daysMax {
		return Generated{}, fmt.Errorf("days %d: want 1 to %d", o.Days, daysMax)
	}
	if o.ClientName == "" {
		o.ClientName = "sinew-client"
	}
	for _, h := range o.Hosts {
		if h == "" || strings.ContainsAny(h, " ,/") {
			return Generated{}, fmt.Errorf("host %q is not a DNS name or IP address", h)
		}
	}
	seen := map[string]bool{}
	for _, id := range o.PeerNodeIDs {
		if id == "" || strings.ContainsAny(id, "/\\ ,") {
			return Generated{}, fmt.Errorf("node id %q: not a node id", id)
		}
		if o.ValidPeerNodeID != nil {
			if err := o.ValidPeerNodeID(id); err != nil {
				return Generated{}, fmt.Errorf("node id %q: %w", id, err)
			}
		}
		if seen[id] {
			return Generated{}, fmt.Errorf("node id %q is named twice", id)
		}
		seen[id] = true
	}
	if len(o.PeerNodeIDs) > 0 && o.PeerCluster == "" {
		return Generated{}, errors.New("peer certificates need a cluster id")
	}
	g := Generated{
		CA:         filepath.Join(o.Dir, CAFile),
		ServerCert: filepath.Join(o.Dir, ServerCertFile), ServerKey: filepath.Join(o.Dir, ServerKeyFile),
		ClientCert: filepath.Join(o.Dir, ClientCertFile), ClientKey: filepath.Join(o.Dir, ClientKeyFile),
	}
	paths := []string{g.CA, g.ServerCert, g.ServerKey, g.ClientCert, g.ClientKey}
	if len(o.PeerNodeIDs) > 0 {
		g.PeerCA = filepath.Join(o.Dir, PeerCAFile)
		paths = append(paths, g.PeerCA)
		for _, id := range o.PeerNodeIDs {
			p := GeneratedPeer{NodeID: id, Cert: filepath.Join(o.Dir, PeerCertFile(id)), Key: filepath.Join(o.Dir, PeerKeyFile(id))}
			g.Peers = append(g.Peers, p)
			paths = append(paths, p.Cert, p.Key)
		}
	}
	if !o.Force {
		var exist []string
		for _, p := range paths {
			if _, err := os.Lstat(p); err == nil {
				exist = append(exist, p)
			}
		}
		if len(exist) > 0 {
			return Generated{}, fmt.Errorf("%w: %s (use --force to overwrite)", ErrExists, strings.Join(exist, ", "))
		}
	}
	notAfter := o.Now.Add(time.Duration(o.Days) * 24 * time.Hour)
	ca, err := NewIssuer("Sinew test CA", o.Now, notAfter)
	if err != nil {
		return Generated{}, err
	}
	notBefore := o.Now.Add(-clockSkewMs * time.Millisecond)
	hosts := append(append([]string{}, DefaultHosts...), o.Hosts...)
	srvCert, srvKey, err := ca.Issue(Leaf{CommonName: "sinew-server", Hosts: hosts, Server: true, NotBefore: notBefore, NotAfter: notAfter})
	if err != nil {
		return Generated{}, err
	}
	cliCert, cliKey, err := ca.Issue(Leaf{CommonName: o.ClientName, Hosts: []string{o.ClientName}, Client: true, NotBefore: notBefore, NotAfter: notAfter})
	if err != nil {
		return Generated{}, err
	}
	files := [][]byte{ca.CertPEM, srvCert, srvKey, cliCert, cliKey}
	if len(o.PeerNodeIDs) > 0 {
		peerCA, err := NewIssuer("Sinew test peer CA", o.Now, notAfter)
		if err != nil {
			return Generated{}, err
		}
		files = append(files, peerCA.CertPEM)
		for _, id := range o.PeerNodeIDs {
			// Both usages: a node dials its peers and accepts them with
			// the same certificate. No host names: peers are known by
			// the node id they name, not by their address.
			cert, key, err := peerCA.Issue(Leaf{CommonName: "sinew-node " + id, URIs: []*url.URL{PeerURI(o.PeerCluster, id)},
				Server: true, Client: true, NotBefore: notBefore, NotAfter: notAfter})
			if err != nil {
				return Generated{}, err
			}
			files = append(files, cert, key)
		}
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return Generated{}, err
	}
	for i, data := range files {
		if err := writeFile0600(paths[i], data); err != nil {
			return Generated{}, err
		}
	}
	return g, nil
}

// writeFile0600 writes data to a temporary file (created 0600) in the same
// directory, syncs it and renames it over path, so a reader never sees half
// a key and an existing file's looser mode is not inherited.
func writeFile0600(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
