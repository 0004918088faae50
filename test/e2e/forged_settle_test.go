package e2e_test

import (
	"bufio"
	"net"
	"slices"
	"testing"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// dialAs opens a raw protocol connection that logs in as user.
func dialAs(t *testing.T, addr, user, password string) *client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &client{t: t, nc: nc, br: bufio.NewReader(nc)}
	c.send(0, &protocol.Hello{ProtocolVersion: protocol.Version, ClientName: "e2e", User: user, Credentials: password})
	expect[*protocol.HelloOK](c)
	return c
}

// TestForgedSettlesChangeNothing runs the real binary with users. A user
// with no permissions at all sends ACK, FAIL and NACK (30-day delay) frames
// whose lease references it made up: every subscription id the broker has
// issued (another consumer's live one, and closed ones of other sessions
// and of another user), every offset of the queue, and the lease ids a
// counter would have given; and the exact references of leases it could
// have learned elsewhere, through other sessions' closed subscriptions.
// Every one is answered stale_lease, the answer a reference to nothing
// gets. So is every reference that a user who may consume the queue forges
// through a live subscription of its own. Nothing changes: the consumer
// that holds five messages settles them all, and the other five are each
// delivered once more, untouched.
func TestForgedSettlesChangeNothing(t *testing.T) {
	bin := buildSinew(t)
	dir := t.TempDir()
	users, err := auth.OpenUsersParams(vfs.OS(), broker.UsersPath(dir), auth.HashParams{TimeCost: 1, MemoryKiB: 64, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	all := []string{"*"}
	for _, u := range []struct {
		name string
		perm auth.Permissions
	}{
		{"root", auth.Permissions{Publish: all, Consume: all, Manage: all}},
		{"carol", auth.Permissions{Consume: []string{"jobs"}}},
		{"dave", auth.Permissions{Consume: []string{"jobs"}}},
		{"mallory", auth.Permissions{}},
	} {
		if err := users.Add(u.name, u.name+" password", u.perm); err != nil {
			t.Fatal(err)
		}
	}
	srv := startChildArgs(t, bin, dir)
	defer stopChild(t, srv)

	root := dialAs(t, srv.addr, "root", "root password")
	root.declare(&protocol.DeclareQueue{Topic: "jobs", Partitions: 2})
	var offsets []uint64
	for i := range 10 {
		offsets = append(offsets, root.publish(&protocol.Publish{Topic: "jobs", Body: []byte{byte('a' + i)}}).Offset)
	}

	// The victim holds the first five.
	victim := dialAs(t, srv.addr, "root", "root password")
	vsub := victim.subscribe(&protocol.Subscribe{Topic: "jobs", Prefetch: 5})
	var held []*protocol.Deliver
	for range 5 {
		held = append(held, victim.next())
	}
	// Another session of root, and carol, each take the sixth message and
	// close their subscription, which hands it back.
	var closedSubs []uint64
	var leaked []protocol.LeaseRef
	for _, who := range []string{"root", "carol"} {
		c := dialAs(t, srv.addr, who, who+" password")
		s := c.subscribe(&protocol.Subscribe{Topic: "jobs", Prefetch: 1})
		d := c.next()
		if _, ok := c.call(&protocol.Unsubscribe{SubID: s.SubID}).(*protocol.OK); !ok {
			t.Fatalf("%s: unsubscribe refused", who)
		}
		closedSubs = append(closedSubs, s.SubID)
		leaked = append(leaked, protocol.LeaseRef{SubID: s.SubID, Partition: d.Partition, Offset: d.Offset, LeaseID: d.LeaseID, Epoch: d.Epoch})
	}
	for _, d := range held {
		for _, sub := range closedSubs {
			leaked = append(leaked, protocol.LeaseRef{SubID: sub, Partition: d.Partition, Offset: d.Offset, LeaseID: d.LeaseID, Epoch: d.Epoch})
		}
	}

	var forged []protocol.LeaseRef
	vehicles := []uint64{vsub.SubID}
	vehicles = append(vehicles, closedSubs...)
	for id := uint64(1); id <= 12; id++ {
		if !slices.Contains(vehicles, id) {
			vehicles = append(vehicles, id)
		}
	}
	for _, sub := range vehicles {
		for _, off := range offsets {
			for lease := uint64(1); lease <= 40; lease++ {
				forged = append(forged, protocol.LeaseRef{SubID: sub, Offset: off, LeaseID: lease})
			}
		}
	}
	forged = append(forged, leaked...)

	// Mallory has no permission at all; dave may consume the queue, and
	// forges through his own live subscription (on the empty partition 1),
	// which a settle by reference may use for any partition of the queue.
	mallory := dialAs(t, srv.addr, "mallory", "mallory password")
	dave := dialAs(t, srv.addr, "dave", "dave password")
	dsub := dave.subscribe(&protocol.Subscribe{Topic: "jobs", Partition: 1, Prefetch: 10})
	var daves []protocol.LeaseRef
	for _, off := range offsets {
		for lease := uint64(1); lease <= 40; lease++ {
			daves = append(daves, protocol.LeaseRef{SubID: dsub.SubID, Offset: off, LeaseID: lease})
		}
	}
	for _, f := range []struct {
		c    *client
		refs []protocol.LeaseRef
	}{{mallory, forged}, {dave, daves}} {
		for _, op := range []protocol.Op{protocol.OpFail, protocol.OpAck, protocol.OpNack} {
			for start := 0; start < len(f.refs); start += 1024 {
				refs := f.refs[start:min(start+1024, len(f.refs))]
				tags := make([]uint64, len(refs))
				var delay int64
				if op == protocol.OpNack {
					delay = 30 * 24 * 3600 * 1000
				}
				r, ok := f.c.call(&protocol.Settle{Kind: op, Tags: tags, DelayMs: delay, Leases: refs}).(*protocol.SettleResult)
				if !ok || len(r.Codes) != len(refs) {
					t.Fatalf("%s: no settle result of %d codes: %+v", op, len(refs), r)
				}
				for i, c := range r.Codes {
					if c != protocol.CodeStaleLease {
						t.Fatalf("%s of forged reference %+v: %s, want stale_lease", op, refs[i], c)
					}
				}
			}
		}
	}

	// Nothing changed: the victim's leases are all still its own.
	tags := make([]uint64, len(held))
	for i, d := range held {
		tags[i] = d.Tag
	}
	for i, c := range victim.settle(protocol.OpAck, 0, tags...) {
		if c != protocol.CodeOK {
			t.Fatalf("victim's ACK of offset %d: %s", held[i].Offset, c)
		}
	}
	// And the other five were all still waiting: with its credit back, the
	// victim's subscription gets each of them once more.
	var got []uint64
	var dtags []uint64
	for range 5 {
		d := victim.next()
		got = append(got, d.Offset)
		dtags = append(dtags, d.Tag)
	}
	slices.Sort(got)
	if !slices.Equal(got, offsets[5:]) {
		t.Fatalf("delivered offsets %v, want %v", got, offsets[5:])
	}
	for _, c := range victim.settle(protocol.OpAck, 0, dtags...) {
		if c != protocol.CodeOK {
			t.Fatalf("victim's second ACK: %s", c)
		}
	}
	victim.quiet()
}
