package tlsconf

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// PeerURIScheme is the scheme of the URI subject alternative name that
// makes a certificate a cluster peer's: sinew-node://<cluster id>/<node id>.
// The raft transport accepts a peer only with a certificate that names,
// in one such URI, the cluster and the node id its hello claims, so that a
// certificate of the same CA made for anything else (a client's, another
// node's) cannot speak for a node.
const PeerURIScheme = "sinew-node"

// ErrNoPeerIdentity reports a certificate without a peer URI for the
// cluster asked about (a client or server certificate, say).
var ErrNoPeerIdentity = errors.New("the certificate names no node")

// PeerURI returns the URI that names node nodeID of cluster in a peer
// certificate.
func PeerURI(cluster, nodeID string) *url.URL {
	return &url.URL{Scheme: PeerURIScheme, Host: cluster, Path: "/" + nodeID}
}

// PeerURIPattern is PeerURI's form for cluster, with <node id> in place of
// the id, for messages that tell what a peer certificate must carry.
func PeerURIPattern(cluster string) string {
	return PeerURIScheme + "://" + cluster + "/<node id>"
}

// PeerNodeID returns the node id that cert names for cluster: the one
// sinew-node URI SAN whose host is cluster. None, or more than one
// (a certificate speaks for one node), is an error; URIs of other schemes
// or other clusters are ignored.
func PeerNodeID(cert *x509.Certificate, cluster string) (string, error) {
	var ids []string
	for _, u := range cert.URIs {
		if u.Scheme != PeerURIScheme || u.Host != cluster {
			continue
		}
		id, ok := strings.CutPrefix(u.Path, "/")
		if !ok || id == "" || strings.Contains(id, "/") || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return "", fmt.Errorf("malformed peer name %q: want %s", u.String(), PeerURIPattern(cluster))
		}
		ids = append(ids, id)
	}
	switch len(ids) {
	case 0:
		return "", fmt.Errorf("%w of cluster %q (a peer certificate carries the URI SAN %s)", ErrNoPeerIdentity, cluster, PeerURIPattern(cluster))
	case 1:
		return ids[0], nil
	default:
		return "", fmt.Errorf("the certificate names %d nodes of cluster %q (%s); a peer certificate names one", len(ids), cluster, strings.Join(ids, ", "))
	}
}
