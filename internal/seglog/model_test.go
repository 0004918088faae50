package seglog

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/sinewmq/sinew/internal/vfs"
)

// logModel is the raft log as a plain slice: entries after a start point.
type logModel struct {
	start, startTerm uint64 // FirstLSN-1 and its term
	recs             []modelRec
}

type modelRec struct {
	term    uint64
	payload []byte
}

func (m *logModel) next() uint64 { return m.start + 1 + uint64(len(m.recs)) }

func (m *logModel) lastTerm() uint64 {
	if len(m.recs) == 0 {
		return m.startTerm
	}
	return m.recs[len(m.recs)-1].term
}

// TestLogModel runs random sequences of AppendAt (at the end and over a
// suffix), the old-API Append, TruncateAfter, ResetTo, Sync, Rotate,
// DropBefore and reopen against a plain model, and after every step compares
// FirstLSN, NextLSN, Term over the whole range, and every record's term and
// bytes.
func TestLogModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		fs := vfs.NewMem()
		o := Options{FS: fs, Dir: "log", SegmentBytes: 4096,
			IndexIntervalBytes: rapid.SampledFrom([]int{64, 512, 4096}).Draw(t, "index"),
			Preallocate:        PreallocMode(rapid.IntRange(0, 2).Draw(t, "prealloc")),
			BufferBytes:        rapid.SampledFrom([]int{512, 4096, 1 << 20}).Draw(t, "buffer")}
		l, err := Open(o)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Close() }()
		m := &logModel{}
		seq := 0
		payload := func(size int) []byte {
			seq++
			return bytes.Repeat([]byte{byte(seq), byte(seq >> 8)}, size/2+1)
		}
		steps := rapid.IntRange(1, 60).Draw(t, "steps")
		for range steps {
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); op {
			case 0, 1, 2: // append at the end
				term := m.lastTerm() + uint64(rapid.IntRange(0, 1).Draw(t, "bump"))
				term = max(term, 1)
				p := payload(rapid.IntRange(0, 900).Draw(t, "size"))
				if err := l.AppendAt(m.next(), term, 2, p); err != nil {
					t.Fatalf("AppendAt(%d): %v", m.next(), err)
				}
				m.recs = append(m.recs, modelRec{term, p})
			case 3: // overwrite a suffix
				if len(m.recs) == 0 {
					continue
				}
				k := rapid.IntRange(0, len(m.recs)-1).Draw(t, "at")
				term := m.lastTerm() + 1
				p := payload(100)
				if err := l.AppendAt(m.start+1+uint64(k), term, 2, p); err != nil {
					t.Fatalf("AppendAt over %d: %v", m.start+1+uint64(k), err)
				}
				m.recs = append(m.recs[:k], modelRec{term, p})
			case 4: // old API
				p := payload(50)
				if _, err := l.Append(2, p); err != nil {
					t.Fatal(err)
				}
				m.recs = append(m.recs, modelRec{max(m.lastTerm(), 1), p})
			case 5:
				k := rapid.IntRange(0, len(m.recs)).Draw(t, "keep")
				if err := l.TruncateAfter(m.start + uint64(k)); err != nil {
					t.Fatalf("TruncateAfter: %v", err)
				}
				m.recs = m.recs[:k]
			case 6:
				idx := m.start + uint64(rapid.IntRange(0, len(m.recs)+10).Draw(t, "snap"))
				term := m.lastTerm() + 1
				if err := l.ResetTo(idx, term); err != nil {
					t.Fatalf("ResetTo: %v", err)
				}
				m.start, m.startTerm, m.recs = idx, term, nil
			case 7:
				if _, err := l.Sync(); err != nil {
					t.Fatal(err)
				}
				if rapid.Bool().Draw(t, "rotate") {
					if err := l.Rotate(); err != nil {
						t.Fatal(err)
					}
				}
			case 8: // retention: whole segments only
				upto := m.start + 1 + uint64(rapid.IntRange(0, len(m.recs)).Draw(t, "drop"))
				if _, err := l.DropBefore(upto); err != nil {
					t.Fatal(err)
				}
				first := l.FirstLSN()
				if first < m.start+1 || first > upto {
					t.Fatalf("DropBefore(%d) left FirstLSN %d (start was %d)", upto, first, m.start+1)
				}
				cut := int(first - (m.start + 1))
				if cut > 0 {
					m.startTerm = m.recs[cut-1].term
				}
				m.start, m.recs = first-1, m.recs[cut:]
			case 9:
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				if l, err = Open(o); err != nil {
					t.Fatal(err)
				}
			}
			if err := compareModel(l, m); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func compareModel(l *Log, m *logModel) error {
	if l.FirstLSN() != m.start+1 || l.NextLSN() != m.next() {
		return fmt.Errorf("log [%d, %d), model [%d, %d)", l.FirstLSN(), l.NextLSN(), m.start+1, m.next())
	}
	if term, err := l.Term(m.start); err != nil || term != m.startTerm {
		return fmt.Errorf("Term(start %d) = %d, %v; model %d", m.start, term, err, m.startTerm)
	}
	if m.start > 0 {
		if _, err := l.Term(m.start - 1); !errors.Is(err, ErrCompacted) {
			return fmt.Errorf("Term before the start: %v", err)
		}
	}
	if l.LastTerm() != m.lastTerm() {
		return fmt.Errorf("LastTerm %d, model %d", l.LastTerm(), m.lastTerm())
	}
	i := 0
	err := l.Scan(0, func(r Record) error {
		want := m.recs[i]
		if r.LSN != m.start+1+uint64(i) || r.Term != want.term || !bytes.Equal(r.Payload, want.payload) {
			return fmt.Errorf("record %d: lsn %d term %d (model term %d), payload equal %v",
				i, r.LSN, r.Term, want.term, bytes.Equal(r.Payload, want.payload))
		}
		if term, err := l.Term(r.LSN); err != nil || term != want.term {
			return fmt.Errorf("Term(%d) = %d, %v", r.LSN, term, err)
		}
		i++
		return nil
	})
	if err != nil {
		return err
	}
	if i != len(m.recs) {
		return fmt.Errorf("scan saw %d records, model has %d", i, len(m.recs))
	}
	if len(m.recs) > 0 {
		k := len(m.recs) / 2
		if r, err := l.Read(m.start + 1 + uint64(k)); err != nil || !bytes.Equal(r.Payload, m.recs[k].payload) {
			return fmt.Errorf("Read(%d): %v", m.start+1+uint64(k), err)
		}
	}
	return nil
}
