package nodeid

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/sinewmq/sinew/internal/vfs"
)

// FileName is the id file's name inside the data directory.
const FileName = "node_id"

const (
	magic        = "sinew-node-id"
	version      = "1"
	idBytes      = 16 // 128 random bits: no two nodes draw the same id
	fileBytesMax = 128
)

// ErrCorrupt reports an id file that does not verify. The node must not
// start with another id; an operator restores the file or retires the
// data directory.
var ErrCorrupt = errors.New("nodeid: id file is damaged")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Load returns the node id kept in dir, creating it from random (nil means
// crypto/rand) if dir has none. dir must exist.
func Load(fsys vfs.FS, dir string, random io.Reader) (string, error) {
	name := filepath.Join(dir, FileName)
	b, err := vfs.ReadFileMax(fsys, name, fileBytesMax)
	switch {
	case err == nil:
		id, err := parse(b)
		if err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return id, nil
	case errors.Is(err, vfs.ErrTooLarge):
		return "", fmt.Errorf("%s: %w: %w", name, ErrCorrupt, err)
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("nodeid: read %s: %w", name, err)
	}
	if random == nil {
		random = rand.Reader
	}
	raw := make([]byte, idBytes)
	if _, err := io.ReadFull(random, raw); err != nil {
		return "", fmt.Errorf("nodeid: draw a new id: %w", err)
	}
	id := hex.EncodeToString(raw)
	if err := vfs.WriteFileAtomic(fsys, name, format(id)); err != nil {
		return "", fmt.Errorf("nodeid: write %s: %w", name, err)
	}
	return id, nil
}

func format(id string) []byte {
	return fmt.Appendf(nil, "%s %s %s %08x\n", magic, version, id, crc32.Checksum([]byte(id), castagnoli))
}

// parse verifies an id file's contents.
func parse(b []byte) (string, error) {
	line, ok := strings.CutSuffix(string(b), "\n")
	f := strings.Split(line, " ")
	if !ok || len(f) != 4 || f[0] != magic {
		return "", fmt.Errorf("%w: not a node id file", ErrCorrupt)
	}
	if f[1] != version {
		return "", fmt.Errorf("%w: version %q, this build reads %q", ErrCorrupt, f[1], version)
	}
	id, sum := f[2], f[3]
	if Check(id) != nil {
		return "", fmt.Errorf("%w: id is not %d lowercase hex bytes", ErrCorrupt, idBytes)
	}
	if want := fmt.Sprintf("%08x", crc32.Checksum([]byte(id), castagnoli)); sum != want {
		return "", fmt.Errorf("%w: checksum %s, want %s", ErrCorrupt, sum, want)
	}
	return id, nil
}

// Check reports whether id has the form of a node id (what Load creates):
// 32 lowercase hex digits. Tools that name nodes before they start (peer
// certificates) use it to refuse a mistyped id.
func Check(id string) error {
	if raw, err := hex.DecodeString(id); err != nil || len(raw) != idBytes || id != strings.ToLower(id) {
		return fmt.Errorf("a node id is %d lowercase hex digits (file %s in the node's data directory)", 2*idBytes, FileName)
	}
	return nil
}
