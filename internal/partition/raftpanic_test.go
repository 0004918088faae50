package partition

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

// A disk that stops returning reads makes etcd raft panic when it reads
// committed entries back from the log. That fails the partition with an
// error: its publishes are refused, it reports the failure, it closes, and
// the process goes on.
func TestRaftStorageReadErrorFailsThePartitionOnly(t *testing.T) {
	fs := vfs.NewMem()
	cfg := testConfig(fs)
	cfg.raftCacheBytes = 1 // raft reads committed entries from the log
	p := mustOpen(t, cfg)
	for i := range 20 {
		mustPublish(t, p, fmt.Sprint("before ", i), nil)
	}
	fs.SetReadError(errors.New("injected read error"))
	// Bursts, so that a stage holds more entries than raft's cache keeps.
	var failed error
	for round := range 20 {
		var chs []chan pubResult
		for i := range 32 {
			chs = append(chs, publish(p, fmt.Sprint("after ", round, i), nil))
		}
		for _, ch := range chs {
			if r := <-ch; r.err != nil && failed == nil {
				failed = r.err
			}
		}
		if failed != nil {
			break
		}
	}
	if failed == nil {
		t.Fatal("every publish succeeded while the disk refused reads; the test no longer reaches raft's storage reads")
	}
	if !errors.Is(failed, ErrUnavailable) {
		t.Errorf("publish error %v, want ErrUnavailable", failed)
	}
	st := p.Stats()
	if st.Err == "" {
		t.Errorf("stats report no failure: %+v", st)
	}
	if r := <-publish(p, "later", nil); !errors.Is(r.err, ErrUnavailable) {
		t.Errorf("publish to the failed partition: %v, want ErrUnavailable", r.err)
	}
	fs.SetReadError(nil)
	p.Close()
}
