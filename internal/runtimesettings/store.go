package runtimesettings

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/sinewmq/sinew/internal/vfs"
)

// FileName is the document's name inside the data directory.
const FileName = "runtime-settings.json"

const (
	// formatVersion is the document layout written and accepted.
	formatVersion = 1
	// docBytesMax bounds the document read at Open; a handful of keys take a
	// few hundred bytes.
	docBytesMax = 1 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Doc is one version of the runtime settings. Values names every key.
type Doc struct {
	Version uint64
	Values  map[string]int64
}

func (d Doc) clone() Doc { return Doc{Version: d.Version, Values: maps.Clone(d.Values)} }

// Store holds the current document and persists changes to it.
type Store struct {
	fs   vfs.FS
	path string
	log  *slog.Logger

	mu  sync.Mutex // serialises Update and Adopt: held across check, write and swap
	cur atomic.Pointer[Doc]

	// commit, when set, takes changes instead of this node's document:
	// in a cluster the controller holds the settings (SetCommitter).
	commit atomic.Pointer[Committer]
}

// Committer commits next, based on version expected, where the settings are
// held (a cluster's controller), and returns the document in force after
// it: next when it was accepted, or the one that won a race (accepted
// false).
type Committer func(expected uint64, next Doc) (cur Doc, accepted bool, err error)

// SetCommitter makes Update hand every change to c instead of writing this
// node's document; the committed document reaches this node through Adopt
// (which Update also calls before it returns).
func (s *Store) SetCommitter(c Committer) { s.commit.Store(&c) }

// Adopt makes d the document in force, written first, unless it is so
// already: the settings committed for the whole cluster. Its version may be
// lower than this node's own (a node joining a cluster takes the cluster's
// settings). A document with a bad key or value is refused.
func (s *Store) Adopt(d Doc) error {
	for _, k := range sortedKeys(d.Values) {
		if err := Check(k, d.Values[k]); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.cur.Load()
	next := cur.clone()
	next.Version = d.Version
	maps.Copy(next.Values, d.Values)
	if next.Version == cur.Version && maps.Equal(next.Values, cur.Values) {
		return nil
	}
	if err := s.write(next); err != nil {
		return fmt.Errorf("runtime settings: write %s: %w", s.path, err)
	}
	s.cur.Store(&next)
	for _, k := range sortedKeys(next.Values) {
		if next.Values[k] != cur.Values[k] {
			s.log.Info("runtime setting changed through the cluster", "key", k, "from", cur.Values[k], "to", next.Values[k], "version", next.Version)
		}
	}
	return nil
}

// Open loads dir's document, or seeds one from seed when dir has none. seed
// maps keys to values; a key it does not name takes its Key.Default. A seed
// naming an unknown key or a value out of range is an error. A document that
// cannot be trusted is an error matching ErrCorrupt; Open never replaces it.
func Open(fsys vfs.FS, dir string, seed map[string]int64, logger *slog.Logger) (*Store, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	for k, v := range seed {
		if err := Check(k, v); err != nil {
			return nil, fmt.Errorf("runtime_seed: %w", err)
		}
	}
	s := &Store{fs: fsys, path: filepath.Join(dir, FileName), log: logger}
	seeded := make(map[string]int64, len(keys))
	for _, k := range keys {
		seeded[k.Name] = k.Default
		if v, ok := seed[k.Name]; ok {
			seeded[k.Name] = v
		}
	}
	data, err := readFile(fsys, s.path)
	if errors.Is(err, os.ErrNotExist) {
		d := Doc{Version: 1, Values: seeded}
		if err := s.write(d); err != nil {
			return nil, fmt.Errorf("runtime settings: seed %s: %w", s.path, err)
		}
		s.cur.Store(&d)
		logger.Info("runtime settings seeded", "path", s.path, "version", d.Version, "values", d.Values)
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("runtime settings: %w", err)
	}
	d, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("runtime settings %s: %w (restore the file from a backup, or remove it to seed again from runtime_seed)", s.path, err)
	}
	var added []string
	for _, k := range keys {
		if _, ok := d.Values[k.Name]; !ok {
			d.Values[k.Name] = seeded[k.Name]
			added = append(added, k.Name)
		}
	}
	if len(added) > 0 {
		d.Version++
		if err := s.write(d); err != nil {
			return nil, fmt.Errorf("runtime settings: add %v to %s: %w", added, s.path, err)
		}
		logger.Info("runtime settings: keys added from runtime_seed", "keys", added, "version", d.Version)
	}
	for _, k := range keys {
		if v, ok := seed[k.Name]; ok && v != d.Values[k.Name] {
			logger.Info("runtime setting differs from runtime_seed; the persisted value applies (change it with PUT /api/v1/settings)",
				"key", k.Name, "value", d.Values[k.Name], "seed", v)
		}
	}
	s.cur.Store(&d)
	logger.Info("runtime settings loaded", "path", s.path, "version", d.Version, "values", d.Values)
	return s, nil
}

// Snapshot returns a copy of the current document.
func (s *Store) Snapshot() Doc { return s.cur.Load().clone() }

// Int returns the current value of key. It panics for a key that is not a
// runtime setting: callers name keys by the constants of this package.
func (s *Store) Int(key string) int64 {
	v, ok := s.cur.Load().Values[key]
	if !ok {
		panic("runtimesettings: unknown key " + key)
	}
	return v
}

// Update applies changes on top of version expected and persists the result
// as version expected+1, before it becomes visible and before Update returns.
// Every key and value is checked first; one bad entry rejects the whole change
// (a *KeyError). A stale expected gets a *ConflictError. A failed write leaves
// the current document in force and returns the error.
func (s *Store) Update(expected uint64, changes map[string]int64) (Doc, error) {
	if len(changes) == 0 {
		return Doc{}, ErrNoChange
	}
	var errs []error
	for _, k := range sortedKeys(changes) {
		if err := Check(k, changes[k]); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return Doc{}, errors.Join(errs...)
	}
	if c := s.commit.Load(); c != nil {
		return s.updateThrough(*c, expected, changes)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, next, err := s.next(expected, changes)
	if err != nil {
		return Doc{}, err
	}
	if err := s.write(next); err != nil {
		return Doc{}, fmt.Errorf("runtime settings: write %s: %w", s.path, err)
	}
	s.cur.Store(&next)
	for _, k := range sortedKeys(changes) {
		s.log.Info("runtime setting changed", "key", k, "from", cur.Values[k], "to", changes[k], "version", next.Version)
	}
	return next.clone(), nil
}

// next returns the current document and the one changes make of it, or a
// *ConflictError when the current one is not version expected.
func (s *Store) next(expected uint64, changes map[string]int64) (*Doc, Doc, error) {
	cur := s.cur.Load()
	if cur.Version != expected {
		return nil, Doc{}, &ConflictError{Expected: expected, Current: cur.clone()}
	}
	next := cur.clone()
	next.Version++
	maps.Copy(next.Values, changes)
	return cur, next, nil
}

// updateThrough is Update with a Committer: the change is based on this
// node's document (which follows the committed one), committed by c, and
// adopted here before it returns. A failure to commit matches
// ErrNotCommitted.
func (s *Store) updateThrough(c Committer, expected uint64, changes map[string]int64) (Doc, error) {
	_, next, err := s.next(expected, changes)
	if err != nil {
		return Doc{}, err
	}
	got, accepted, err := c(expected, next)
	if err != nil {
		return Doc{}, fmt.Errorf("%w: %w", ErrNotCommitted, err)
	}
	// The cluster's versions only go up: a later one adopted meanwhile
	// stays.
	if got.Version > s.cur.Load().Version {
		if err := s.Adopt(got); err != nil {
			return Doc{}, err
		}
	}
	if !accepted {
		return Doc{}, &ConflictError{Expected: expected, Current: got.clone()}
	}
	return s.Snapshot(), nil
}

func sortedKeys(m map[string]int64) []string {
	out := make([]string, 0, len(m))
	for _, k := range keys {
		if _, ok := m[k.Name]; ok {
			out = append(out, k.Name)
		}
	}
	for k := range m {
		if _, ok := Lookup(k); !ok {
			out = append(out, k)
		}
	}
	return out
}

func (s *Store) write(d Doc) error { return vfs.WriteFileAtomic(s.fs, s.path, encode(d)) }

// file is the document on disk; payload is what the checksum covers.
type file struct {
	CRC32C   uint32          `json:"crc32c"`
	Settings json.RawMessage `json:"settings"`
}

type payload struct {
	Format  int              `json:"format"`
	Version uint64           `json:"version"`
	Values  map[string]int64 `json:"values"`
}

func encode(d Doc) []byte {
	body, err := json.Marshal(payload{Format: formatVersion, Version: d.Version, Values: d.Values})
	if err != nil {
		panic("runtimesettings: encode: " + err.Error()) // a map of int64 always encodes
	}
	out, err := json.MarshalIndent(file{CRC32C: crc32.Checksum(body, castagnoli), Settings: body}, "", "  ")
	if err != nil {
		panic("runtimesettings: encode: " + err.Error())
	}
	return append(out, '\n')
}

func decode(data []byte) (Doc, error) {
	var f file
	if err := strictUnmarshal(data, &f); err != nil {
		return Doc{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if len(f.Settings) == 0 {
		return Doc{}, fmt.Errorf("%w: no settings", ErrCorrupt)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, f.Settings); err != nil {
		return Doc{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if got := crc32.Checksum(compact.Bytes(), castagnoli); got != f.CRC32C {
		return Doc{}, fmt.Errorf("%w: checksum %d, expected %d", ErrCorrupt, got, f.CRC32C)
	}
	var p payload
	if err := strictUnmarshal(f.Settings, &p); err != nil {
		return Doc{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if p.Format != formatVersion {
		return Doc{}, fmt.Errorf("%w: format %d, this broker reads %d", ErrCorrupt, p.Format, formatVersion)
	}
	if p.Version == 0 {
		return Doc{}, fmt.Errorf("%w: version 0", ErrCorrupt)
	}
	if p.Values == nil {
		p.Values = map[string]int64{}
	}
	for _, k := range sortedKeys(p.Values) {
		if err := Check(k, p.Values[k]); err != nil {
			return Doc{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
	}
	return Doc{Version: p.Version, Values: p.Values}, nil
}

func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the document")
	}
	return nil
}

func readFile(fsys vfs.FS, name string) ([]byte, error) {
	data, err := vfs.ReadFileMax(fsys, name, docBytesMax)
	if errors.Is(err, vfs.ErrTooLarge) {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return data, err
}

func u64(v uint64) string { return strconv.FormatUint(v, 10) }
