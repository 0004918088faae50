package broker

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// catalogueOnly is a Cluster whose catalogue holds one queue, placed on
// node 2 only, and which counts the creations it is asked for. This node
// is node 1. Methods a test does not reach are the nil embedded
// interface's (a call would panic, failing the test).
type catalogueOnly struct {
	Cluster
	held    CatalogueQueue
	creates atomic.Int32
}

func (c *catalogueOnly) Self() uint64                { return 1 }
func (c *catalogueOnly) Fenced() bool                { return false }
func (c *catalogueOnly) PeerAlive(uint64) bool       { return true }
func (c *catalogueOnly) ReplicationWant() int        { return 3 }
func (c *catalogueOnly) ClientAddr(id uint64) string { return "node2:7654" }
func (c *catalogueOnly) Lookup(topic, group string) (CatalogueQueue, bool) {
	if topic == c.held.Topic && group == c.held.Group {
		return c.held, true
	}
	return CatalogueQueue{}, false
}
func (c *catalogueOnly) CreateQueue(ctx context.Context, topic, group string, settings []byte, partitions int) (CatalogueQueue, error) {
	c.creates.Add(1)
	if topic == c.held.Topic && group == c.held.Group {
		return c.held, nil
	}
	return CatalogueQueue{}, errors.New("this test creates nothing")
}

// A refused CreateCheck stops creation on first use before anything is
// created or proposed, and its error is the request's; a queue that
// exists (here, or in a cluster's catalogue on other nodes) never asks
// it. The check is given the queue's topic and group.
func TestCreateCheck(t *testing.T) {
	denied := protocol.Errorf(protocol.CodePermissionDenied, "no creating")
	var asked []string
	deny := func(topic, group string) error {
		asked = append(asked, topic+"/"+group)
		return denied
	}
	pub := func(b *Broker, p *protocol.Publish, check CreateCheck) error {
		ch := make(chan error, 1)
		b.PublishChecked(p, check, func(_ protocol.PublishOK, err error) { ch <- err })
		return <-ch
	}

	t.Run("single", func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		if err := pub(b, &protocol.Publish{Topic: "new", Group: "g", Partition: -1}, deny); !errors.Is(err, denied) {
			t.Fatalf("publish creating: %v, want the check's error", err)
		}
		if _, err := b.SubscribeWith(&protocol.Subscribe{Topic: "new2", Partition: -1, AckMode: protocol.AckManual}, &rec{}, SubscribeOptions{MayCreate: deny}); !errors.Is(err, denied) {
			t.Fatalf("subscribe creating: %v, want the check's error", err)
		}
		if n := len(b.Stats().Queues); n != 0 {
			t.Fatalf("%d queues after refused creations", n)
		}
		if len(asked) != 2 || asked[0] != "new/g" || asked[1] != "new2/" {
			t.Fatalf("asked %v", asked)
		}
		asked = nil
		mustPublish(t, b, msg("made", "x"))
		if err := pub(b, msg("made", "y"), deny); err != nil {
			t.Fatalf("publish to an existing queue: %v", err)
		}
		if _, err := b.SubscribeWith(&protocol.Subscribe{Topic: "made", Partition: -1, AckMode: protocol.AckManual}, &rec{}, SubscribeOptions{MayCreate: deny}); err != nil {
			t.Fatalf("subscribe to an existing queue: %v", err)
		}
		if len(asked) != 0 {
			t.Fatalf("an existing queue asked the check: %v", asked)
		}
	})

	t.Run("cluster", func(t *testing.T) {
		settings, _ := json.Marshal(&queueMeta{Version: metaVersion, Topic: "elsewhere", Partitions: 1})
		cl := &catalogueOnly{held: CatalogueQueue{Topic: "elsewhere", Settings: settings,
			Partitions: []RaftPlacement{{RaftGroup: 7, Replicas: []uint64{2}}}}}
		cfg := testConfig(vfs.NewMem())
		cfg.Cluster = cl
		b := mustOpen(t, cfg)
		defer b.Close()
		asked = nil
		// Held by the catalogue, on another node: not a creation; the
		// answer is that node's, as before.
		err := pub(b, msg("elsewhere", "x"), deny)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != protocol.CodeNotOwner || pe.Owner != "node2:7654" {
			t.Fatalf("publish to a queue placed elsewhere: %v, want not_owner", err)
		}
		if len(asked) != 0 {
			t.Fatalf("a catalogue queue asked the check: %v", asked)
		}
		// Not in the catalogue: refused before the controller is asked.
		before := cl.creates.Load()
		if err := pub(b, msg("nowhere", "x"), deny); !errors.Is(err, denied) {
			t.Fatalf("publish creating in a cluster: %v, want the check's error", err)
		}
		if cl.creates.Load() != before {
			t.Fatal("a refused creation was proposed to the controller")
		}
	})
}
