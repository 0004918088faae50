package vfs

import (
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// ErrCrashed is returned by every operation on a MemFS (and its open files)
// after Crash: the "machine" it belonged to is gone.
var ErrCrashed = errors.New("vfs: file system crashed")

// MemFS is an in-memory FS that tracks what is durable so tests can simulate
// power loss with Crash. See the package documentation for the model.
//
// Beyond FS it offers fault injection (SetWriteError, SetSyncError) and
// medium-level corruption helpers (FlipBit, TruncateFile, ZeroRange) that
// change the bytes "on the platter", bypassing the durability model.
//
// One mutex guards everything, including open files.
type MemFS struct {
	mu sync.Mutex
	// cur is the namespace a live process sees: cleaned path -> node.
	cur map[string]*memNode
	// durable is the namespace a crash would leave: an entry changes here
	// only when its parent directory is synced.
	durable  map[string]*memNode
	crashed  bool
	writeErr error
	syncErr  error
	readErr  error
	// locks holds the cleaned names locked by Lock and not yet released.
	locks map[string]bool
}

// memNode is an inode: file data or a directory marker. Several names (in
// cur and durable) may point at one node, as with a rename not yet synced.
type memNode struct {
	dir  bool
	mode os.FileMode
	// data is what reads see; synced is what survives a crash.
	data   []byte
	synced []byte
	// pending holds the changes since the last Sync in order; applying them
	// to synced yields data. Crash with tear keeps a prefix of them.
	pending []memOp
}

// memOp is one unsynced change: a write of data at off, or a resize to size.
type memOp struct {
	resize bool
	off    int64
	data   []byte
	size   int64
}

func (op memOp) apply(b []byte) []byte {
	if op.resize {
		return resize(b, op.size)
	}
	end := op.off + int64(len(op.data))
	if end > int64(len(b)) {
		b = resize(b, end)
	}
	copy(b[op.off:], op.data)
	return b
}

func resize(b []byte, size int64) []byte {
	if size <= int64(len(b)) {
		return b[:size]
	}
	if size <= int64(cap(b)) {
		old := len(b)
		b = b[:size]
		clear(b[old:])
		return b
	}
	nb := make([]byte, size, max(size, 2*int64(cap(b))))
	copy(nb, b)
	return nb
}

// NewMem returns an empty in-memory file system. The roots "." and "/"
// always exist.
func NewMem() *MemFS {
	return &MemFS{cur: map[string]*memNode{}, durable: map[string]*memNode{}, locks: map[string]bool{}}
}

func clean(name string) string { return filepath.Clean(name) }

func isRoot(name string) bool { return name == "." || name == "/" || name == filepath.Dir(name) }

func perr(op, name string, err error) error { return &os.PathError{Op: op, Path: name, Err: err} }

// lookup returns the node for a cleaned name in cur (roots are implicit dirs).
func (m *MemFS) lookup(name string) (*memNode, bool) {
	if isRoot(name) {
		return &memNode{dir: true, mode: os.ModeDir | 0o755}, true
	}
	n, ok := m.cur[name]
	return n, ok
}

func (m *MemFS) parentIsDir(name string) bool {
	p, ok := m.lookup(filepath.Dir(name))
	return ok && p.dir
}

// OpenFile implements FS.
func (m *MemFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return nil, perr("open", name, ErrCrashed)
	}
	c := clean(name)
	n, ok := m.lookup(c)
	switch {
	case ok && flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, perr("open", name, os.ErrExist)
	case ok && n.dir && flag&(os.O_WRONLY|os.O_RDWR) != 0:
		return nil, perr("open", name, errors.New("is a directory"))
	case !ok && flag&os.O_CREATE == 0:
		return nil, perr("open", name, os.ErrNotExist)
	case !ok:
		if !m.parentIsDir(c) {
			return nil, perr("open", name, os.ErrNotExist)
		}
		n = &memNode{mode: perm & os.ModePerm}
		m.cur[c] = n
	}
	if flag&os.O_TRUNC != 0 && !n.dir && len(n.data) > 0 {
		if m.writeErr != nil {
			return nil, perr("open", name, m.writeErr)
		}
		n.change(memOp{resize: true, size: 0})
	}
	return &memFile{fs: m, n: n, name: name, flag: flag}, nil
}

func (n *memNode) change(op memOp) {
	if !op.resize {
		op.data = slices.Clone(op.data)
	}
	n.data = op.apply(n.data)
	n.pending = append(n.pending, op)
}

func (n *memNode) sync() {
	for _, op := range n.pending {
		n.synced = op.apply(n.synced)
	}
	n.pending = nil
}

// Remove implements FS.
func (m *MemFS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return perr("remove", name, ErrCrashed)
	}
	c := clean(name)
	n, ok := m.cur[c]
	if !ok {
		return perr("remove", name, os.ErrNotExist)
	}
	if n.dir && len(m.children(m.cur, c)) > 0 {
		return perr("remove", name, errors.New("directory not empty"))
	}
	delete(m.cur, c)
	return nil
}

// Rename implements FS.
func (m *MemFS) Rename(oldname, newname string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return perr("rename", oldname, ErrCrashed)
	}
	o, nn := clean(oldname), clean(newname)
	n, ok := m.cur[o]
	if !ok {
		return perr("rename", oldname, os.ErrNotExist)
	}
	if !m.parentIsDir(nn) {
		return perr("rename", newname, os.ErrNotExist)
	}
	if t, ok := m.cur[nn]; ok && t.dir {
		return perr("rename", newname, os.ErrExist)
	}
	if o == nn {
		return nil
	}
	delete(m.cur, o)
	m.cur[nn] = n
	if n.dir { // move the subtree with it
		for k, v := range m.cur {
			if strings.HasPrefix(k, o+string(filepath.Separator)) {
				delete(m.cur, k)
				m.cur[nn+k[len(o):]] = v
			}
		}
	}
	return nil
}

// MkdirAll implements FS.
func (m *MemFS) MkdirAll(dir string, perm os.FileMode) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return perr("mkdir", dir, ErrCrashed)
	}
	c := clean(dir)
	var missing []string
	for p := c; !isRoot(p); p = filepath.Dir(p) {
		n, ok := m.cur[p]
		if ok {
			if !n.dir {
				return perr("mkdir", p, errors.New("not a directory"))
			}
			break
		}
		missing = append(missing, p)
	}
	for _, p := range slices.Backward(missing) {
		m.cur[p] = &memNode{dir: true, mode: os.ModeDir | perm&os.ModePerm}
	}
	return nil
}

// children returns the sorted base names directly inside dir in ns.
func (m *MemFS) children(ns map[string]*memNode, dir string) []string {
	var out []string
	for k := range ns {
		if filepath.Dir(k) == dir && k != dir {
			out = append(out, filepath.Base(k))
		}
	}
	slices.Sort(out)
	return out
}

// ReadDir implements FS.
func (m *MemFS) ReadDir(dir string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return nil, perr("readdir", dir, ErrCrashed)
	}
	c := clean(dir)
	n, ok := m.lookup(c)
	if !ok {
		return nil, perr("readdir", dir, os.ErrNotExist)
	}
	if !n.dir {
		return nil, perr("readdir", dir, errors.New("not a directory"))
	}
	return m.children(m.cur, c), nil
}

// Stat implements FS.
func (m *MemFS) Stat(name string) (os.FileInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return nil, perr("stat", name, ErrCrashed)
	}
	n, ok := m.lookup(clean(name))
	if !ok {
		return nil, perr("stat", name, os.ErrNotExist)
	}
	return n.info(name), nil
}

// SyncDir implements FS: the entries of dir in the live namespace replace
// its entries in the durable one.
func (m *MemFS) SyncDir(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return perr("syncdir", dir, ErrCrashed)
	}
	c := clean(dir)
	n, ok := m.lookup(c)
	if !ok || !n.dir {
		return perr("syncdir", dir, os.ErrNotExist)
	}
	if m.syncErr != nil {
		return perr("syncdir", dir, m.syncErr)
	}
	for k := range m.durable {
		if filepath.Dir(k) == c && k != c {
			delete(m.durable, k)
		}
	}
	for k, v := range m.cur {
		if filepath.Dir(k) == c && k != c {
			m.durable[k] = v
		}
	}
	return nil
}

// SyncAll implements AllSyncer: every file's data and every directory's
// entries become durable, as if each were synced.
func (m *MemFS) SyncAll(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return perr("syncall", dir, ErrCrashed)
	}
	if m.syncErr != nil {
		return perr("syncall", dir, m.syncErr)
	}
	clear(m.durable)
	for k, n := range m.cur {
		m.durable[k] = n
		if !n.dir {
			n.sync()
		}
	}
	return nil
}

// Lock implements FS with an in-memory lock table: the lock is held until
// the returned file is closed.
func (m *MemFS) Lock(name string) (File, error) {
	f, err := m.OpenFile(name, os.O_RDWR|os.O_CREATE, FilePerm)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c := clean(name)
	if m.locks[c] {
		f.(*memFile).closed = true
		return nil, perr("flock", name, ErrLocked)
	}
	m.locks[c] = true
	mf := f.(*memFile)
	mf.lock = c
	return mf, nil
}

// SetWriteError makes every later data change (Write, WriteAt, Truncate,
// Allocate, O_TRUNC) fail with err and change nothing, as a full disk
// would. nil clears the fault.
func (m *MemFS) SetWriteError(err error) {
	m.mu.Lock()
	m.writeErr = err
	m.mu.Unlock()
}

// SetReadError makes every later Read and ReadAt fail with err, as a
// failing disk would. nil clears the fault.
func (m *MemFS) SetReadError(err error) {
	m.mu.Lock()
	m.readErr = err
	m.mu.Unlock()
}

// SetSyncError makes every later File.Sync and SyncDir fail with err and
// persist nothing. nil clears the fault.
func (m *MemFS) SetSyncError(err error) {
	m.mu.Lock()
	m.syncErr = err
	m.mu.Unlock()
}

// Crash simulates power loss. It returns the file system a rebooted machine
// would find, and makes m unusable (ErrCrashed) because its processes died.
//
// The image holds only durable directory entries whose ancestors are durable
// too, and only synced file data. With tear, each file additionally keeps a
// random prefix of its unsynced changes, the last of which may itself be cut
// short (a torn write). rng drives those choices; files are visited in name
// order so a seed reproduces the same image.
func (m *MemFS) Crash(rng *rand.Rand, tear bool) *MemFS {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.crashed = true
	out := NewMem()
	names := make([]string, 0, len(m.durable))
	for k := range m.durable {
		names = append(names, k)
	}
	slices.Sort(names)
	copies := map[*memNode]*memNode{}
	for _, k := range names {
		if !m.durableAncestors(k) {
			continue
		}
		n := m.durable[k]
		c, ok := copies[n]
		if !ok {
			c = &memNode{dir: n.dir, mode: n.mode, data: slices.Clone(n.synced)}
			if tear && len(n.pending) > 0 {
				keep := rng.IntN(len(n.pending) + 1)
				for _, op := range n.pending[:keep] {
					c.data = op.apply(c.data)
				}
				if keep < len(n.pending) {
					if op := n.pending[keep]; !op.resize && len(op.data) > 0 {
						op.data = op.data[:rng.IntN(len(op.data))]
						c.data = op.apply(c.data)
					}
				}
			}
			c.synced = slices.Clone(c.data)
			copies[n] = c
		}
		out.cur[k] = c
		out.durable[k] = c
	}
	return out
}

func (m *MemFS) durableAncestors(name string) bool {
	for p := filepath.Dir(name); !isRoot(p); p = filepath.Dir(p) {
		n, ok := m.durable[p]
		if !ok || !n.dir {
			return false
		}
	}
	return true
}

// mediumNode finds a file for the corruption helpers.
func (m *MemFS) mediumNode(op, name string) (*memNode, error) {
	if m.crashed {
		return nil, perr(op, name, ErrCrashed)
	}
	n, ok := m.cur[clean(name)]
	if !ok || n.dir {
		return nil, perr(op, name, os.ErrNotExist)
	}
	return n, nil
}

// FlipBit inverts one bit of a file, in both its live and durable contents,
// as media corruption would.
func (m *MemFS) FlipBit(name string, off int64, bit uint) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.mediumNode("flipbit", name)
	if err != nil {
		return err
	}
	if off < 0 || off >= int64(len(n.data)) {
		return perr("flipbit", name, io.ErrUnexpectedEOF)
	}
	n.data[off] ^= 1 << (bit % 8)
	if off < int64(len(n.synced)) {
		n.synced[off] ^= 1 << (bit % 8)
	}
	return nil
}

// ZeroRange overwrites [off, off+size) of a file with zeros in both its live
// and durable contents, clipped to the file.
func (m *MemFS) ZeroRange(name string, off, size int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.mediumNode("zerorange", name)
	if err != nil {
		return err
	}
	for _, b := range [][]byte{n.data, n.synced} {
		lo, hi := min(max(off, 0), int64(len(b))), min(max(off+size, 0), int64(len(b)))
		clear(b[lo:hi])
	}
	return nil
}

// TruncateFile cuts (or zero-extends) a file to size, durably.
func (m *MemFS) TruncateFile(name string, size int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.mediumNode("truncatefile", name)
	if err != nil {
		return err
	}
	n.sync()
	n.data = resize(n.data, size)
	n.synced = slices.Clone(n.data)
	return nil
}

// ReadFile returns a copy of a file's live contents.
func (m *MemFS) ReadFile(name string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.mediumNode("readfile", name)
	if err != nil {
		return nil, err
	}
	return slices.Clone(n.data), nil
}

// WriteFile creates or replaces a file with data, durably: contents and
// directory entry both survive a crash (its parent directory must exist).
func (m *MemFS) WriteFile(name string, data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return perr("writefile", name, ErrCrashed)
	}
	c := clean(name)
	if !m.parentIsDir(c) {
		return perr("writefile", name, os.ErrNotExist)
	}
	if n, ok := m.cur[c]; ok && n.dir {
		return perr("writefile", name, errors.New("is a directory"))
	}
	n := &memNode{mode: FilePerm, data: slices.Clone(data), synced: slices.Clone(data)}
	m.cur[c] = n
	m.durable[c] = n
	return nil
}

func (n *memNode) info(name string) os.FileInfo {
	return memInfo{name: filepath.Base(name), size: int64(len(n.data)), mode: n.mode, dir: n.dir}
}

type memInfo struct {
	name string
	size int64
	mode os.FileMode
	dir  bool
}

func (i memInfo) Name() string       { return i.name }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) Mode() os.FileMode  { return i.mode }
func (i memInfo) ModTime() time.Time { return time.Time{} } // MemFS keeps no clock.
func (i memInfo) IsDir() bool        { return i.dir }
func (i memInfo) Sys() any           { return nil }

// memFile is an open MemFS file; all state is guarded by fs.mu.
type memFile struct {
	fs     *MemFS
	n      *memNode
	name   string
	flag   int
	off    int64
	closed bool
	// lock is the name whose lock this file holds (see MemFS.Lock), or "".
	lock string
}

func (f *memFile) check(op string, write bool) error {
	switch {
	case f.fs.crashed:
		return perr(op, f.name, ErrCrashed)
	case f.closed:
		return perr(op, f.name, os.ErrClosed)
	case write && f.flag&(os.O_WRONLY|os.O_RDWR) == 0:
		return perr(op, f.name, errors.New("file not open for writing"))
	case !write && f.flag&os.O_WRONLY != 0:
		return perr(op, f.name, errors.New("file not open for reading"))
	case write && f.fs.writeErr != nil:
		return perr(op, f.name, f.fs.writeErr)
	}
	return nil
}

func (f *memFile) readAt(p []byte, off int64) (int, error) {
	if off >= int64(len(f.n.data)) {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	k := copy(p, f.n.data[off:])
	if k < len(p) {
		return k, io.EOF
	}
	return k, nil
}

func (f *memFile) Read(p []byte) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("read", false); err != nil {
		return 0, err
	}
	if f.fs.readErr != nil {
		return 0, perr("read", f.name, f.fs.readErr)
	}
	k, err := f.readAt(p, f.off)
	f.off += int64(k)
	if k > 0 && err == io.EOF {
		err = nil
	}
	return k, err
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("read", false); err != nil {
		return 0, err
	}
	if f.fs.readErr != nil {
		return 0, perr("read", f.name, f.fs.readErr)
	}
	if off < 0 {
		return 0, perr("read", f.name, errors.New("negative offset"))
	}
	return f.readAt(p, off)
}

func (f *memFile) Write(p []byte) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("write", true); err != nil {
		return 0, err
	}
	if f.flag&os.O_APPEND != 0 {
		f.off = int64(len(f.n.data))
	}
	f.n.change(memOp{off: f.off, data: p})
	f.off += int64(len(p))
	return len(p), nil
}

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("write", true); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, perr("write", f.name, errors.New("negative offset"))
	}
	f.n.change(memOp{off: off, data: p})
	return len(p), nil
}

func (f *memFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("truncate", true); err != nil {
		return err
	}
	if size < 0 {
		return perr("truncate", f.name, errors.New("negative size"))
	}
	f.n.change(memOp{resize: true, size: size})
	return nil
}

// Allocate implements Allocator by growing the file with zeros.
func (f *memFile) Allocate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("allocate", true); err != nil {
		return err
	}
	if size > int64(len(f.n.data)) {
		f.n.change(memOp{resize: true, size: size})
	}
	return nil
}

func (f *memFile) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	// Only a crash or a close stop a sync; the access mode does not.
	switch {
	case f.fs.crashed:
		return perr("sync", f.name, ErrCrashed)
	case f.closed:
		return perr("sync", f.name, os.ErrClosed)
	case f.fs.syncErr != nil:
		return perr("sync", f.name, f.fs.syncErr)
	}
	f.n.sync()
	return nil
}

func (f *memFile) Stat() (os.FileInfo, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.crashed {
		return nil, perr("stat", f.name, ErrCrashed)
	}
	if f.closed {
		return nil, perr("stat", f.name, os.ErrClosed)
	}
	return f.n.info(f.name), nil
}

func (f *memFile) Name() string { return f.name }

func (f *memFile) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return perr("close", f.name, os.ErrClosed)
	}
	f.closed = true
	if f.lock != "" {
		delete(f.fs.locks, f.lock)
	}
	return nil
}
