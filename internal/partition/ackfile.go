package partition

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
)

// The ACK memory outlives a checkpoint. Recovery rebuilds it from the ACK
// records it replays, which are only those after the checkpoint; every
// checkpoint therefore also writes the memory as it stands (ackMemoryFile,
// written before the checkpoint itself), and recovery starts from that file.
// An ACK whose answer was lost is then answered ok when repeated after any
// number of restarts and checkpoints, as long as it is among the partition's
// last ackMemoryMax ACKs.
//
// The file is a memory, not a record: one that is missing or damaged is
// logged and recovery goes on with what the log replays. Every entry in it
// is an ACK committed before some checkpoint, so a file newer than the
// checkpoint beside it (a crash between the two writes) only holds ACKs the
// replay brings back again.
//
// Format: magic "SNWA", version 1, uvarint count, then count pairs (uvarint
// offset, u64 lease id) oldest first, then a CRC-32C of everything before.
const (
	ackMemoryFile    = "ackmemory"
	ackFileMagic     = "SNWA"
	ackFileVersion   = 1
	ackFileBytesMax  = 5 + binary.MaxVarintLen64 + ackMemoryMax*(binary.MaxVarintLen64+8) + 4
	ackFileEntryMin  = 1 + 8
	ackFileHeaderLen = 5
)

func (p *Partition) ackPath() string { return filepath.Join(p.cfg.Dir, ackMemoryFile) }

// encode returns the memory in the file format, oldest entry first (a
// packed memory in offset order, which is how unpack orders it too).
func (a *ackMemory) encode() []byte {
	b := make([]byte, 0, ackFileHeaderLen+binary.MaxVarintLen64+a.n*(4+8)+4)
	b = append(b, ackFileMagic...)
	b = append(b, ackFileVersion)
	b = binary.AppendUvarint(b, uint64(a.n))
	add := func(key, lease uint64) {
		b = binary.AppendUvarint(b, key-1)
		b = binary.LittleEndian.AppendUint64(b, lease)
	}
	switch {
	case a.packed != nil:
		for _, s := range a.packed {
			add(s.key, s.lease)
		}
	case a.slots != nil:
		for i := range len(a.order) {
			off := a.order[(a.head+i)%len(a.order)]
			j, ok := a.find(off + 1)
			if !ok {
				panic("partition: ACK memory order names an offset it does not hold")
			}
			add(off+1, a.slots[j].lease)
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeAckMemory rebuilds a memory from encode's output.
func decodeAckMemory(b []byte) (ackMemory, error) {
	a := newAckMemory()
	if len(b) < ackFileHeaderLen+1+4 || string(b[:4]) != ackFileMagic {
		return a, errors.New("not an ACK memory file")
	}
	if b[4] != ackFileVersion {
		return a, fmt.Errorf("ACK memory version %d, want %d", b[4], ackFileVersion)
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return a, errors.New("ACK memory checksum mismatch")
	}
	rest := body[ackFileHeaderLen:]
	n, k := binary.Uvarint(rest)
	if k <= 0 || n > ackMemoryMax || n > uint64(len(rest)-k)/ackFileEntryMin {
		return a, errors.New("ACK memory count out of range")
	}
	rest = rest[k:]
	for range n {
		off, k := binary.Uvarint(rest)
		if k <= 0 || off == ^uint64(0) || len(rest)-k < 8 {
			return newAckMemory(), errors.New("ACK memory entry cut short")
		}
		a.put(off, binary.LittleEndian.Uint64(rest[k:]))
		rest = rest[k+8:]
	}
	if len(rest) != 0 {
		return newAckMemory(), fmt.Errorf("ACK memory has %d bytes after its entries", len(rest))
	}
	return a, nil
}

// loadAckMemory returns the ACK memory the last checkpoint wrote, or an
// empty one (a missing or damaged file is logged, not fatal).
func (p *Partition) loadAckMemory() ackMemory {
	raw, err := readFileMax(p.cfg.FS, p.ackPath(), ackFileBytesMax)
	if err == nil && raw == nil {
		return newAckMemory()
	}
	var a ackMemory
	if err == nil {
		a, err = decodeAckMemory(raw)
	}
	if err != nil {
		p.logger.Warn("ACK memory not restored: a repeated ACK from before the last checkpoint will be answered stale_lease", "err", err)
		return newAckMemory()
	}
	return a
}
