package tlsconf

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// recordTypeHandshake is the first byte of every TLS ClientHello record
// (RFC 8446 5.1, the same since SSL 3.0). A Sinew frame starts with its
// length prefix, whose first byte is 0 for any frame under 16 MiB.
const recordTypeHandshake = 0x16

// plaintextReplyTimeoutMs bounds writing the error to a plaintext peer, so
// one that does not read cannot hold the connection.
const plaintextReplyTimeoutMs = 1000

// ErrPlaintext is returned by a Conn whose peer did not start a TLS
// handshake; the peer was sent a plaintext error first.
var ErrPlaintext = errors.New("tls: the peer sent plaintext on a TLS port")

// PlaintextOnTLSMessage is what a plaintext Sinew client reads in the
// ERROR bad_request frame it gets from a TLS port.
const PlaintextOnTLSMessage = "this port requires TLS: connect with TLS (sinew --tls, sinew.WithTLS)"

// CertUser says which name of a verified client certificate becomes the
// connection's user (tls.client_cert_user).
type CertUser string

// The ways to name a certificate's owner.
const (
	// CertUserOff ignores client certificates for identity: the HELLO's
	// credentials decide, as without mTLS.
	CertUserOff CertUser = ""
	// CertUserCN takes the subject's common name.
	CertUserCN CertUser = "cn"
	// CertUserSAN takes the first DNS name, else the first e-mail address,
	// else the first URI of the subject alternative names.
	CertUserSAN CertUser = "san"
)

// ParseCertUser checks a tls.client_cert_user value.
func ParseCertUser(s string) (CertUser, error) {
	switch CertUser(s) {
	case CertUserOff, CertUserCN, CertUserSAN:
		return CertUser(s), nil
	}
	return "", fmt.Errorf("client_cert_user %q: want cn or san (or empty)", s)
}

// ListenerOptions shape a Listener's connections.
type ListenerOptions struct {
	// CertUser names the verified client certificate's user; see
	// Conn.PeerCertName.
	CertUser CertUser
}

// Listener accepts TLS connections, like tls.NewListener, and answers a
// peer that starts with anything but a TLS handshake record with a
// plaintext Sinew ERROR bad_request (PlaintextOnTLSMessage) before closing,
// so a client that forgot TLS sees why instead of waiting for a reply that
// never comes.
type Listener struct {
	net.Listener
	cfg *tls.Config
	o   ListenerOptions

	plaintext, failed atomic.Uint64
}

// ListenerStats counts the connections a Listener did not let through.
type ListenerStats struct {
	// Plaintext counts peers whose first byte was not a TLS handshake
	// record; they got the plaintext error.
	Plaintext uint64
	// Failed counts TLS handshakes that began and failed: an untrusted,
	// expired or missing client certificate, no common version or cipher,
	// a timeout or a cut in the middle. A peer that closes before sending
	// a byte (a TCP probe) counts in neither.
	Failed uint64
}

// Stats returns the counters.
func (l *Listener) Stats() ListenerStats {
	return ListenerStats{Plaintext: l.plaintext.Load(), Failed: l.failed.Load()}
}

// NewListener wraps inner; cfg is usually a Reloader's ServerConfig.
func NewListener(inner net.Listener, cfg *tls.Config, o ListenerOptions) *Listener {
	return &Listener{Listener: inner, cfg: cfg, o: o}
}

// Accept returns the next connection. It does no I/O on it: the sniff and
// the handshake run at the connection's first Read or Write.
func (l *Listener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &Conn{raw: nc, cfg: l.cfg, o: l.o, ln: l}, nil
}

// Conn is a server-side TLS connection from Listener.
type Conn struct {
	raw net.Conn
	cfg *tls.Config
	o   ListenerOptions
	ln  *Listener // counts failures; nil outside a Listener

	hsMu   sync.Mutex // held for the whole sniff and handshake
	hsDone bool
	hsErr  error
	tc     *tls.Conn // set once hsDone without error; read only after taking hsMu
}

// Handshake sniffs the first byte and runs the TLS handshake, once; Read and
// Write call it. Its deadline is the connection's read deadline.
func (c *Conn) Handshake() error {
	c.hsMu.Lock()
	defer c.hsMu.Unlock()
	if !c.hsDone {
		c.hsErr = c.handshake()
		c.hsDone = true
	}
	return c.hsErr
}

func (c *Conn) handshake() error {
	var first [1]byte
	if _, err := io.ReadFull(c.raw, first[:]); err != nil {
		return err
	}
	if first[0] != recordTypeHandshake {
		if c.ln != nil {
			c.ln.plaintext.Add(1)
		}
		c.replyPlaintext(first[0])
		return ErrPlaintext
	}
	tc := tls.Server(&prefixConn{Conn: c.raw, prefix: first[:]}, c.cfg)
	if err := tc.Handshake(); err != nil {
		if c.ln != nil {
			c.ln.failed.Add(1)
		}
		return err
	}
	c.tc = tc
	return nil
}

// replyPlaintext answers a peer that sent plaintext. When the bytes so far
// are a Sinew frame header, the ERROR echoes its request id, so the client
// matches it to its HELLO; the rest of the header is read under the
// connection's read deadline (a Sinew client sends its whole HELLO at once).
func (c *Conn) replyPlaintext(first byte) {
	head := make([]byte, protocol.LengthBytes+protocol.HeaderBytes)
	head[0] = first
	var reqID uint64
	if first == 0 {
		if _, err := io.ReadFull(c.raw, head[1:]); err == nil {
			reqID = binary.BigEndian.Uint64(head[protocol.LengthBytes+4:])
		}
	}
	frame := protocol.AppendFrame(nil, 0, reqID, &protocol.ErrorBody{Code: protocol.CodeBadRequest, Message: PlaintextOnTLSMessage})
	c.raw.SetWriteDeadline(time.Now().Add(plaintextReplyTimeoutMs * time.Millisecond))
	c.raw.Write(frame)
}

// Read reads decrypted bytes, handshaking first.
func (c *Conn) Read(b []byte) (int, error) {
	if err := c.Handshake(); err != nil {
		return 0, err
	}
	return c.tc.Read(b)
}

// Write writes through TLS, handshaking first.
func (c *Conn) Write(b []byte) (int, error) {
	if err := c.Handshake(); err != nil {
		return 0, err
	}
	return c.tc.Write(b)
}

// Close closes the socket. It sends no close_notify: Sinew frames carry
// their own boundaries, and a close must not wait on a peer that is not
// reading.
func (c *Conn) Close() error { return c.raw.Close() }

// LocalAddr is the socket's local address.
func (c *Conn) LocalAddr() net.Addr { return c.raw.LocalAddr() }

// RemoteAddr is the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.raw.RemoteAddr() }

// SetDeadline sets the socket's deadlines; they bound the handshake too.
func (c *Conn) SetDeadline(t time.Time) error { return c.raw.SetDeadline(t) }

// SetReadDeadline sets the socket's read deadline.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.raw.SetReadDeadline(t) }

// SetWriteDeadline sets the socket's write deadline.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.raw.SetWriteDeadline(t) }

// ConnectionState returns the TLS state once the handshake succeeded, and
// false before or after a failed one.
func (c *Conn) ConnectionState() (tls.ConnectionState, bool) {
	c.hsMu.Lock()
	defer c.hsMu.Unlock()
	if c.tc == nil {
		return tls.ConnectionState{}, false
	}
	return c.tc.ConnectionState(), true
}

// PeerCertName returns the user name of the peer's client certificate, as
// ListenerOptions.CertUser says, or "" when CertUser is off, the peer gave
// no certificate, or the certificate carries no such name. Only a
// certificate the client CA verified counts.
func (c *Conn) PeerCertName() string {
	if c.o.CertUser == CertUserOff {
		return ""
	}
	st, ok := c.ConnectionState()
	if !ok || len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return ""
	}
	leaf := st.VerifiedChains[0][0]
	switch c.o.CertUser {
	case CertUserCN:
		return leaf.Subject.CommonName
	case CertUserSAN:
		switch {
		case len(leaf.DNSNames) > 0:
			return leaf.DNSNames[0]
		case len(leaf.EmailAddresses) > 0:
			return leaf.EmailAddresses[0]
		case len(leaf.URIs) > 0:
			return leaf.URIs[0].String()
		}
	}
	return ""
}

// prefixConn replays the sniffed byte before reading the socket.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (p *prefixConn) Read(b []byte) (int, error) {
	if len(p.prefix) > 0 {
		n := copy(b, p.prefix)
		p.prefix = p.prefix[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}
