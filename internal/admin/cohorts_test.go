package admin

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

type nopConsumer struct{}

func (nopConsumer) Deliver(*broker.Subscription, broker.Delivery) {}
func (nopConsumer) Closed(*broker.Subscription, uint8, error)     {}

// GET /api/v1/cohorts lists a cohort's members, plan, and each partition's
// member, epoch, pause and lag, in snake_case; /api/v1/cohorts/{topic}
// filters by queue (group from ?group=), and answers 404 for a queue the
// broker does not have.
func TestCohortsAPI(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := broker.Open(broker.Config{DataDir: "data", FS: vfs.NewMem(), DefaultLeaseMs: 10_000})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		h := Handler(Config{Broker: b})
		list := func(path string) (int, CohortList, map[string]any) {
			t.Helper()
			code, body := get(t, h, path)
			var l CohortList
			var raw map[string]any
			if code == 200 {
				if err := json.Unmarshal([]byte(body), &l); err != nil {
					t.Fatalf("%s: %v\n%s", path, err, body)
				}
				json.Unmarshal([]byte(body), &raw)
			}
			return code, l, raw
		}
		if code, l, raw := list("/api/v1/cohorts"); code != 200 || len(l.Cohorts) != 0 || raw["cohorts"] == nil {
			t.Fatalf("no cohorts: %d %+v (the list must be [], not null)", code, l)
		}
		for _, q := range []*protocol.DeclareQueue{
			{Topic: "orders", Partitions: 2, MaxRetries: -1},
			{Topic: "orders", Group: "eu", Partitions: 2, MaxRetries: -1},
		} {
			if _, err := b.Declare(context.Background(), q); err != nil {
				t.Fatal(err)
			}
		}
		published := make(chan error, 1)
		b.Publish(&protocol.Publish{Topic: "orders", Partition: 1, Body: []byte("x")}, func(_ protocol.PublishOK, err error) { published <- err })
		if err := <-published; err != nil {
			t.Fatal(err)
		}
		for _, s := range []*protocol.Subscribe{
			{Topic: "orders", Partition: -1, Prefetch: 1, Cohort: "billing", Member: "m1"},
			{Topic: "orders", Group: "eu", Partition: -1, Prefetch: 1, Cohort: "audit", Member: "a1"},
		} {
			if _, err := b.Subscribe(s, nopConsumer{}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Second) // the planner's delay
		synctest.Wait()

		code, l, raw := list("/api/v1/cohorts")
		if code != 200 || len(l.Cohorts) != 2 || l.Cohorts[0].Group != "" || l.Cohorts[1].Group != "eu" {
			t.Fatalf("cohorts: %d %+v", code, l)
		}
		c := l.Cohorts[0]
		if c.Topic != "orders" || c.Cohort != "billing" || !slices.Equal(c.Members, []string{"m1"}) || c.Planner != "local" ||
			c.Generation != 1 || !slices.Equal(c.Owners, []string{"m1", "m1"}) || c.Paused != 0 || c.Lag != 1 || len(c.Partitions) != 2 {
			t.Fatalf("billing: %+v", c)
		}
		p := c.Partitions[1]
		if p.Partition != 1 || p.Planned != "m1" || !p.Held || p.Member != "m1" || p.Epoch != 2 || p.Paused || p.Lag != 1 || !p.Owned || p.Owner != "" {
			t.Fatalf("billing partition 1: %+v", p)
		}
		first := raw["cohorts"].([]any)[0].(map[string]any)
		part := first["partitions"].([]any)[0].(map[string]any)
		for _, k := range []string{"topic", "group", "cohort", "members", "planner", "generation", "owners", "paused", "lag", "partitions"} {
			if _, ok := first[k]; !ok {
				t.Errorf("cohort JSON lacks %q: %v", k, first)
			}
		}
		for _, k := range []string{"partition", "planned", "held", "member", "epoch", "paused", "lag", "owned"} {
			if _, ok := part[k]; !ok {
				t.Errorf("partition JSON lacks %q: %v", k, part)
			}
		}

		if code, l, _ := list("/api/v1/cohorts/orders?group=eu"); code != 200 || len(l.Cohorts) != 1 || l.Cohorts[0].Cohort != "audit" {
			t.Fatalf("cohorts of orders/eu: %d %+v", code, l)
		}
		if code, l, _ := list("/api/v1/cohorts/orders"); code != 200 || len(l.Cohorts) != 1 || l.Cohorts[0].Cohort != "billing" {
			t.Fatalf("cohorts of orders: %d %+v", code, l)
		}
		code, body := get(t, h, "/api/v1/cohorts/nope")
		var e ErrorBody
		if code != 404 || json.Unmarshal([]byte(body), &e) != nil || e.Code != "not_found" {
			t.Fatalf("cohorts of a missing queue: %d %s", code, body)
		}
	})
}
