package clusternode

import "testing"

func TestReachablePeer(t *testing.T) {
	for _, c := range []struct {
		gossip, peer string
		want         bool
	}{
		{"127.0.0.1:7946", "127.0.0.1:7947", true},
		{"10.0.0.2:7946", "10.0.0.2:7947", true},
		{"10.0.0.2:7946", "127.0.0.1:7947", false}, // another machine's loopback
		{"[::1]:7946", "[::1]:7947", true},
		{"10.0.0.2:7946", "[::1]:7947", false},
	} {
		if got := reachablePeer(c.gossip, c.peer); got != c.want {
			t.Errorf("reachablePeer(%s, %s) = %v, want %v", c.gossip, c.peer, got, c.want)
		}
	}
}
