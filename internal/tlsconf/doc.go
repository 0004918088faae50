// Package tlsconf serves TLS for the broker's listeners: certificates and an
// optional client CA read from PEM files and reloaded without dropping
// connections, mutual TLS, the verified client certificate's name for use as
// the connection's user, a listener that answers a plaintext Sinew client
// with a readable error instead of a hang, a generator of self-signed
// certificates for trying TLS out (sinew cert generate), and the name a
// cluster peer's certificate carries (PeerURI, PeerNodeID: the URI SAN
// sinew-node://<cluster id>/<node id>, which the raft transport checks).
//
// Reload: a Reloader holds the current material (certificate, client CA
// pool and the tls.Config built from them) behind an atomic pointer.
// Handshakes read it through tls.Config.GetConfigForClient, so a reload
// changes what new handshakes see and leaves established connections
// alone: their session keys do not depend on the files any more. Reload
// runs on SIGHUP (the caller's signal handler) and from Watch, which hashes
// the files on every tick and reloads when the hash changes. A reload that
// fails (a missing file, a key that does not match its certificate, a CA file
// without certificates) keeps the old material, is logged with the reason
// and counted; Watch retries only once the files change again, so a broken
// file is logged once, not on every tick. Reloads are serialised by
// Reloader.mu; handshakes never take it.
//
// Goroutines: Watch runs on the caller's goroutine until its context ends.
// A Conn from Listener does its sniff and TLS handshake on the goroutine
// that first reads or writes it (the server's reader), so the server's
// handshake timeout, a read deadline, bounds both.
//
// Durability: nothing here is durable; Generate writes files with mode 0600
// and refuses to overwrite them unless asked to.
package tlsconf
