package broker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"github.com/sinewmq/sinew/internal/ckfile"
	"github.com/sinewmq/sinew/internal/vfs"
)

// queueMeta is a queue's durable definition. It lives in
// DataDir/queues/<topic>/<group>/meta, a checksummed file (internal/ckfile)
// written atomically (temporary file, fsync, rename, directory fsync) on
// creation and on every change:
//
//	{"v":1,"topic":"orders","group":"", ...}\n     one line of JSON
//	crc32c 1a2b3c4d\n                             CRC-32C of the JSON line, hex
//
// Settings are stored resolved (the broker defaults in force when they were
// chosen), except the dead-letter target of modes "default" and "global",
// which follows Config.DeadLetterTopic.
type queueMeta struct {
	Version          int    `json:"v"`
	Topic            string `json:"topic"`
	Group            string `json:"group"`
	Partitions       uint32 `json:"partitions"`
	LeaseMs          int64  `json:"lease_ms"`
	MaxRetries       int    `json:"max_retries"` // redeliveries; 0 = none
	DefaultTTLMs     int64  `json:"default_ttl_ms"`
	DeadLetterMode   uint8  `json:"dead_letter_mode"`
	DeadLetterTarget string `json:"dead_letter_target,omitempty"`
	// DeadLetterQueue marks a queue created as a dead-letter target (or the
	// global dead-letter queue): it keeps every message (deadletter.go).
	DeadLetterQueue bool `json:"dead_letter_queue,omitempty"`
	// Incarnation tells this queue from an earlier one of the same name:
	// set at creation when the node WAL is on, it names the partitions'
	// WAL groups (Broker.walGroup).
	Incarnation string `json:"incarnation,omitempty"`
	// Raft is each partition's raft group and replicas in a cluster (as
	// the controller's catalogue placed them); empty on a single node,
	// whose partitions are raft groups of one.
	Raft []RaftPlacement `json:"raft,omitempty"`
}

const (
	metaVersion  = 1
	metaFile     = "meta"
	metaBytesMax = 64 << 10
)

// metaJSON is m's payload in its meta file.
func metaJSON(m *queueMeta) []byte {
	js, err := json.Marshal(m)
	if err != nil {
		panic("broker: queue metadata does not marshal: " + err.Error())
	}
	return js
}

// decodeMetaJSON decodes and checks a verified meta payload.
func decodeMetaJSON(js []byte) (*queueMeta, error) {
	var m queueMeta
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if m.Version != metaVersion {
		return nil, fmt.Errorf("version %d, want %d", m.Version, metaVersion)
	}
	if m.Partitions == 0 || m.Partitions > PartitionsMax {
		return nil, fmt.Errorf("partition count %d out of range", m.Partitions)
	}
	return &m, nil
}

// readMeta reads and verifies a meta file. A file that fails its checksum
// is a *ckfile.CorruptError (errors.Is ckfile.ErrCorrupt).
func readMeta(fsys vfs.FS, name string) (*queueMeta, error) {
	js, err := ckfile.Read(fsys, name, metaBytesMax)
	if err != nil {
		return nil, err
	}
	m, err := decodeMetaJSON(js)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return m, nil
}

func writeMeta(fsys vfs.FS, name string, m *queueMeta) error {
	return ckfile.Write(fsys, name, metaJSON(m))
}

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
