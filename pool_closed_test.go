package sinew

import (
	"errors"
	"testing"
)

// TestEndpointMadeAfterCloseIsShut: a resend or lookup still running when
// Close took the pool's endpoints may ask for a new one; it is born shut, so
// it never connects and no supervisor outlives the client.
func TestEndpointMadeAfterCloseIsShut(t *testing.T) {
	b := newFakeBroker(t)
	c := dialT(t, b.addr())
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	other := newFakeBroker(t)
	e := c.pool.get(other.addr())
	if err := e.openOnce(testCtx(t)); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("open after Close: %v, want ErrClientClosed", err)
	}
	if n := c.pool.size(); n != 1 {
		t.Fatalf("pool holds %d endpoints after Close, want only the client's own", n)
	}
}
