package broker

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// placesElsewhere is a Cluster whose controller places every new queue on
// nodes 2, 3 and 4, never on this node (node 1). A queue in foreign is
// created by another node's proposal at the moment this node proposes
// it: the catalogue then holds foreign's settings, not this node's.
// Methods a test does not reach are the nil embedded interface's.
type placesElsewhere struct {
	Cluster
	mu      sync.Mutex
	queues  map[queueKey]CatalogueQueue
	foreign map[queueKey][]byte
	next    uint64
}

func (c *placesElsewhere) Self() uint64          { return 1 }
func (c *placesElsewhere) Fenced() bool          { return false }
func (c *placesElsewhere) PeerAlive(uint64) bool { return true }
func (c *placesElsewhere) ReplicationWant() int  { return 3 }
func (c *placesElsewhere) ClientAddr(id uint64) string {
	return map[uint64]string{2: "node2:7654", 3: "node3:7654", 4: "node4:7654"}[id]
}

func (c *placesElsewhere) Lookup(topic, group string) (CatalogueQueue, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	q, ok := c.queues[queueKey{topic, group}]
	return q, ok
}

func (c *placesElsewhere) CreateQueue(_ context.Context, topic, group string, settings []byte, partitions int) (CatalogueQueue, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := queueKey{topic, group}
	if q, ok := c.queues[k]; ok {
		return q, nil
	}
	if s, ok := c.foreign[k]; ok {
		settings = s
	}
	q := CatalogueQueue{Topic: topic, Group: group, Settings: settings}
	for p := range partitions {
		c.next++
		rs := []uint64{2 + uint64(p)%3, 2 + uint64(p+1)%3, 2 + uint64(p+2)%3}
		q.Partitions = append(q.Partitions, RaftPlacement{RaftGroup: 100 + c.next, Replicas: rs, Bootstrap: rs})
	}
	c.queues[k] = q
	return q, nil
}

func (c *placesElsewhere) UpdateQueue(_ context.Context, topic, group string, settings []byte) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := queueKey{topic, group}
	q, ok := c.queues[k]
	if ok {
		q.Settings = settings
		c.queues[k] = q
	}
	return ok, nil
}

// A declaration through a node that the placement leaves out creates the
// queue in the catalogue and succeeds (created, its partition count), as
// through any node; declaring it again is not a creation, another
// partition count is conflict, and changed settings reach the catalogue.
// A request that needs a replica here (a first publish, a peek) is
// not_owner naming a node that holds one, never internal. When another
// node's proposal created the queue first, the declaration is not a
// creation and its settings are committed over the other's.
func TestDeclareThroughANodeWithoutAReplica(t *testing.T) {
	cl := &placesElsewhere{queues: map[queueKey]CatalogueQueue{}, foreign: map[queueKey][]byte{}}
	cfg := testConfig(vfs.NewMem())
	cfg.Cluster = cl
	b := mustOpen(t, cfg)
	defer b.Close()
	ctx := context.Background()

	ok, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "orders", Partitions: 2, MaxRetries: -1})
	if err != nil || !ok.Created || ok.Partitions != 2 {
		t.Fatalf("declare through a node without a replica: %+v %v, want created with 2 partitions", ok, err)
	}
	cq, found := cl.Lookup("orders", "")
	if !found || len(cq.Partitions) != 2 {
		t.Fatalf("catalogue after the declaration: %+v %v", cq, found)
	}
	if len(b.queueEntries()) != 0 {
		t.Fatal("a queue placed elsewhere was opened here")
	}
	ok, err = b.Declare(ctx, &protocol.DeclareQueue{Topic: "orders", Partitions: 2, MaxRetries: -1})
	if err != nil || ok.Created || ok.Partitions != 2 {
		t.Fatalf("declaring it again: %+v %v, want not created, 2 partitions", ok, err)
	}
	if _, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "orders", Partitions: 3, MaxRetries: -1}); protocol.CodeOf(err) != protocol.CodeConflict {
		t.Fatalf("declaring it with 3 partitions: %v, want conflict", err)
	}
	if _, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "orders", MaxRetries: 9}); err != nil {
		t.Fatalf("declaring new settings: %v", err)
	}
	if c, err := b.Config("orders", ""); err != nil || c.MaxRetries != 9 || c.Partitions != 2 {
		t.Fatalf("config after new settings: %+v %v", c, err)
	}

	var pe *protocol.Error
	_, err = publish(t, b, msg("fresh", "x"))
	if !errors.As(err, &pe) || pe.Code != protocol.CodeNotOwner || pe.Owner == "" {
		t.Fatalf("first publish of a queue placed elsewhere: %v, want not_owner with an owner", err)
	}
	if _, err := b.Peek(ctx, "orders", "", 0, 0, 10); !errors.As(err, &pe) || pe.Code != protocol.CodeNotOwner || pe.Owner == "" {
		t.Fatalf("peek of a queue placed elsewhere: %v, want not_owner with an owner", err)
	}
	if _, err := b.Peek(ctx, "nothing", "", 0, 0, 10); protocol.CodeOf(err) != protocol.CodeNotFound {
		t.Fatalf("peek of no queue: %v, want not_found", err)
	}

	other := &queueMeta{Version: metaVersion, Topic: "raced", Partitions: 1, MaxRetries: 2}
	cl.foreign[queueKey{"raced", ""}], _ = json.Marshal(other)
	ok, err = b.Declare(ctx, &protocol.DeclareQueue{Topic: "raced", Partitions: 1, MaxRetries: 5})
	if err != nil || ok.Created || ok.Partitions != 1 {
		t.Fatalf("declaration another node's proposal created first: %+v %v, want not created", ok, err)
	}
	if c, err := b.Config("raced", ""); err != nil || c.MaxRetries != 5 {
		t.Fatalf("config of the raced queue: %+v %v, want this declaration's retries", c, err)
	}
}
