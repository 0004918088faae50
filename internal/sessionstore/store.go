package sessionstore

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"

	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
)

// Defaults for Options fields left zero.
const (
	// CheckpointEveryRecordsDefault is how many records the log takes
	// between checkpoints.
	CheckpointEveryRecordsDefault = 4096
	// segmentBytes is the log's segment size: records are small and a
	// checkpoint rotates the log, so segments stay far below it.
	segmentBytes = 4 << 20
	logDir       = "log"
	ckptFile     = "checkpoint"
)

// ErrClosed is returned by writes after Close.
var ErrClosed = errors.New("sessionstore: closed")

// Options configure Open.
type Options struct {
	// FS is the file system (default vfs.OS()); Dir the store's directory,
	// created if missing (DataDir/sessions in sinew serve).
	FS  vfs.FS
	Dir string
	// CheckpointEveryRecords is how many records are appended between
	// checkpoints (default CheckpointEveryRecordsDefault).
	CheckpointEveryRecords int
	// Logger receives recovery and checkpoint reports; default discards.
	Logger *slog.Logger
}

// Store is the durable record of sessions. See the package documentation.
type Store struct {
	opts Options
	log  *seglog.Log

	mu        sync.Mutex
	st        *state
	restored  []Session
	sinceCkpt int
	buf       []byte
	closed    bool
}

// Open loads the store in opts.Dir (creating it if missing), counts a new
// boot, checkpoints and drops the log it covered. The sessions found are
// returned by Restored.
func Open(opts Options) (*Store, error) {
	if opts.FS == nil {
		opts.FS = vfs.OS()
	}
	if opts.Dir == "" {
		return nil, errors.New("sessionstore: Dir is required")
	}
	if opts.CheckpointEveryRecords <= 0 {
		opts.CheckpointEveryRecords = CheckpointEveryRecordsDefault
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if err := opts.FS.MkdirAll(opts.Dir, vfs.DirPerm); err != nil {
		return nil, fmt.Errorf("sessionstore: %w", err)
	}
	// The directory entries must be durable before anything in them is.
	for _, d := range []string{opts.Dir, filepath.Dir(opts.Dir)} {
		if err := opts.FS.SyncDir(d); err != nil {
			return nil, fmt.Errorf("sessionstore: %w", err)
		}
	}
	st, covers, err := readCheckpoint(opts.FS, filepath.Join(opts.Dir, ckptFile))
	if err != nil {
		return nil, fmt.Errorf("sessionstore: %w", err)
	}
	replayed := 0
	l, err := seglog.Open(seglog.Options{
		FS: opts.FS, Dir: filepath.Join(opts.Dir, logDir), SegmentBytes: segmentBytes,
		Sync: seglog.SyncInterval, Logger: opts.Logger,
		ReplayFrom: covers,
		Replay: func(r seglog.Record) error {
			replayed++
			return st.apply(r.Type, r.Payload)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("sessionstore: open log: %w", err)
	}
	if covers > l.NextLSN() {
		// The checkpoint covers records the log no longer has past its
		// end: a log cut at damage. The checkpoint alone is the state.
		opts.Logger.Warn("session log ends before its checkpoint; using the checkpoint", "covers", covers, "next_lsn", l.NextLSN())
	}
	st.boot++
	s := &Store{opts: opts, log: l, st: st}
	for _, x := range st.sessions {
		s.restored = append(s.restored, cloneSession(x))
	}
	slices.SortFunc(s.restored, func(a, b Session) int { return cmpStr(a.ClientID, b.ClientID) })
	s.mu.Lock()
	err = s.checkpointLocked()
	s.mu.Unlock()
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("sessionstore: %w", err)
	}
	opts.Logger.Info("session store opened", "sessions", len(s.restored), "replayed", replayed, "boot", st.boot, "next_sub_id", st.nextSubID)
	return s, nil
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cloneSession(x *Session) Session {
	c := *x
	c.Subs = slices.Clone(x.Subs)
	return c
}

func readCheckpoint(fsys vfs.FS, name string) (*state, uint64, error) {
	b, err := vfs.ReadFileMax(fsys, name, ckptBytesMax)
	if errors.Is(err, fs.ErrNotExist) {
		return newState(), 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	st, covers, err := decodeCheckpoint(b)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", name, err)
	}
	return st, covers, nil
}

// Restored returns the sessions the store held at Open, by client id.
func (s *Store) Restored() []Session { return s.restored }

// Boot returns the boot counter: 1 on a fresh store, one more at each Open.
func (s *Store) Boot() uint64 { return s.st.boot }

// NextSubID returns an id above every subscription id ever recorded, as of
// Open. Ids handed out from there on are new.
func (s *Store) NextSubID() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.nextSubID
}

// Len returns the number of sessions the store holds now.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.st.sessions)
}

// Create records a new session: its broker's owner id, the principal that
// opened it (auth.Principal.Owner; a resume by anyone else is rejected) and
// its token's hash. The record reaches the OS before Create returns, and the
// disk with the next sync.
func (s *Store) Create(clientID, ownerID, principal string, tokenHash [TokenHashBytes]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := appendStr(s.buf[:0], clientID)
	b = appendStr(b, ownerID)
	b = append(b, tokenHash[:]...)
	b = appendStr(b, principal)
	return s.appendLocked(recCreateOwned, b)
}

// Subscribe records a subscription of clientID, durably: it returns once
// the record and every one before it are fsynced.
func (s *Store) Subscribe(clientID string, sub Sub) error {
	s.mu.Lock()
	b := appendSub(appendStr(s.buf[:0], clientID), sub)
	typ := recSubscribe
	if sub.Cohort != "" || sub.Member != "" {
		b, typ = appendCohort(b, sub), recSubscribeCohort
	}
	err := s.appendLocked(typ, b)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	// Outside mu: other sessions' records join this fsync.
	if _, err := s.log.Sync(); err != nil {
		return fmt.Errorf("sessionstore: sync: %w", err)
	}
	return nil
}

// Unsubscribe records that a subscription closed.
func (s *Store) Unsubscribe(clientID string, subID uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if x := s.st.sessions[clientID]; x == nil || !slices.ContainsFunc(x.Subs, func(c Sub) bool { return c.ID == subID }) {
		return nil // nothing to forget
	}
	b := appendStr(s.buf[:0], clientID)
	b = appendUvarint(b, subID)
	return s.appendLocked(recUnsubscribe, b)
}

// End records that a session ended: a restart does not restore it.
func (s *Store) End(clientID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st.sessions[clientID] == nil {
		return nil
	}
	return s.appendLocked(recEnd, appendStr(s.buf[:0], clientID))
}

// appendLocked appends one record, applies it and hands it to the OS; a
// checkpoint follows when enough records have accumulated.
func (s *Store) appendLocked(typ uint8, payload []byte) error {
	s.buf = payload
	if s.closed {
		return ErrClosed
	}
	if _, err := s.log.Append(typ, payload); err != nil {
		return fmt.Errorf("sessionstore: append: %w", err)
	}
	if err := s.st.apply(typ, payload); err != nil {
		// Our own encoding: a failure is a broken invariant.
		panic(fmt.Sprintf("sessionstore: apply of own record: %v", err))
	}
	if _, err := s.log.Flush(); err != nil {
		return fmt.Errorf("sessionstore: flush: %w", err)
	}
	s.sinceCkpt++
	if s.sinceCkpt >= s.opts.CheckpointEveryRecords {
		if err := s.checkpointLocked(); err != nil {
			// The records are in the log; a later checkpoint retries.
			s.opts.Logger.Warn("session checkpoint failed", "err", err)
		}
	}
	return nil
}

// Persist makes every record durable and writes a checkpoint: what a
// planned restart calls before it stops. It is safe to call more than once.
func (s *Store) Persist() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return s.checkpointLocked()
}

// checkpointLocked syncs the log, rotates it, writes the state as of its
// NextLSN and drops the segments before that.
func (s *Store) checkpointLocked() error {
	if _, err := s.log.Sync(); err != nil {
		return fmt.Errorf("sync log: %w", err)
	}
	if err := s.log.Rotate(); err != nil {
		return fmt.Errorf("rotate log: %w", err)
	}
	covers := s.log.NextLSN()
	if err := vfs.WriteFileAtomic(s.opts.FS, filepath.Join(s.opts.Dir, ckptFile), encodeCheckpoint(s.st, covers)); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	s.sinceCkpt = 0
	if _, err := s.log.DropBefore(covers); err != nil {
		return fmt.Errorf("drop covered log: %w", err)
	}
	return nil
}

// Close syncs and closes the store. Later writes get ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.log.Close()
}
