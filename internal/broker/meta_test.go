package broker

import (
	"bytes"
	"errors"
	"os"
	"reflect"
	"testing"

	"github.com/sinewmq/sinew/internal/ckfile"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// The testdata/meta-* files were written by the broker before queue meta
// moved to internal/ckfile. They still load, and writing what they hold
// reproduces them byte for byte.
func TestMetaFixtures(t *testing.T) {
	for _, c := range []struct {
		file string
		want queueMeta
	}{
		{"meta-single-v1", queueMeta{Version: 1, Topic: "orders", Group: "billing", Partitions: 4, LeaseMs: 30000,
			MaxRetries: 5, DeadLetterMode: protocol.DeadLetterQueue, DeadLetterTarget: "orders.dead",
			Incarnation: "0a1b2c3d4e5f6789"}},
		{"meta-cluster-v1", queueMeta{Version: 1, Topic: "sinew.dead-letter", Partitions: 2, LeaseMs: 10000,
			MaxRetries: -1, DefaultTTLMs: 86400000, DeadLetterQueue: true,
			Raft: []RaftPlacement{{RaftGroup: 7, Replicas: []uint64{1, 2, 3}, Bootstrap: []uint64{1, 2, 3}},
				{RaftGroup: 8, Replicas: []uint64{2, 3, 1}}}}},
	} {
		fixture, err := os.ReadFile("testdata/" + c.file)
		if err != nil {
			t.Fatal(err)
		}
		m := vfs.NewMem()
		if err := m.MkdirAll("q", vfs.DirPerm); err != nil {
			t.Fatal(err)
		}
		if err := m.WriteFile("q/meta", fixture); err != nil {
			t.Fatal(err)
		}
		got, err := readMeta(m, "q/meta")
		if err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		if !reflect.DeepEqual(*got, c.want) {
			t.Fatalf("%s: %+v, want %+v", c.file, *got, c.want)
		}
		if err := writeMeta(m, "q/meta2", got); err != nil {
			t.Fatal(err)
		}
		again, err := m.ReadFile("q/meta2")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, fixture) {
			t.Fatalf("%s: rewritten as\n%s\nwant\n%s", c.file, again, fixture)
		}
		if err := m.FlipBit("q/meta", 20, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := readMeta(m, "q/meta"); !errors.Is(err, ckfile.ErrCorrupt) {
			t.Fatalf("%s with a flipped bit: %v, want ckfile.ErrCorrupt", c.file, err)
		}
	}
}
