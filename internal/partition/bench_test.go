package partition

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
)

// benchRoot is where benchmarks put data: $SINEW_BENCH_DIR when set (so a
// run can target a particular disk), else a fresh temporary directory.
func benchRoot(b *testing.B) string {
	if d := os.Getenv("SINEW_BENCH_DIR"); d != "" {
		dir := filepath.Join(d, "partition")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		return dir
	}
	return b.TempDir()
}

const (
	recoverRecords   = 1_000_000
	recoverBodyBytes = 1024
)

// buildRecoverDir writes a partition of recoverRecords unsettled 1 KiB
// messages (straight through seglog, outside any timing) and, with ckpt, a
// checkpoint that covers all of them. It returns the partition directory.
func buildRecoverDir(b *testing.B, root string, ckpt bool) string {
	dir := filepath.Join(root, fmt.Sprintf("recover-ckpt-%v", ckpt))
	os.RemoveAll(dir)
	fs := vfs.OS()
	if err := fs.MkdirAll(filepath.Join(dir, logDir), 0o755); err != nil {
		b.Fatal(err)
	}
	log, err := seglog.Open(seglog.Options{FS: fs, Dir: filepath.Join(dir, logDir)})
	if err != nil {
		b.Fatal(err)
	}
	st := queue.New(queue.Config{})
	body := make([]byte, recoverBodyBytes)
	var buf []byte
	for i := range recoverRecords {
		m := &queue.Message{Body: body, PublishedAtMs: 1_700_000_000_000 + int64(i)}
		ev := queue.Event{Kind: queue.KindEnqueue, Msg: m}
		buf = ev.Marshal(buf[:0])
		lsn, err := log.Append(uint8(queue.KindEnqueue), buf)
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Apply(lsn, ev); err != nil {
			b.Fatal(err)
		}
	}
	if err := log.Close(); err != nil {
		b.Fatal(err)
	}
	if ckpt {
		data := encodeCheckpoint(st.NextLSN(), st.Snapshot(nil), nil)
		if err := WriteFileAtomic(fs, filepath.Join(dir, checkpointFile), data); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// BenchmarkRecover1M measures Open of a partition holding 1,000,000
// unsettled 1 KiB messages: with a checkpoint (restore the snapshot, verify
// the log's checksums, replay nothing) and without (decode and apply every
// record).
func BenchmarkRecover1M(b *testing.B) {
	root := benchRoot(b)
	for _, ckpt := range []bool{true, false} {
		b.Run(fmt.Sprintf("checkpoint=%v", ckpt), func(b *testing.B) {
			dir := buildRecoverDir(b, root, ckpt)
			defer os.RemoveAll(dir)
			cfg := Config{Dir: dir, FS: vfs.OS(), CheckpointEveryRecords: 1 << 30}
			cfg.normalize()
			for b.Loop() {
				// recover without starting the actor: Close would write a
				// checkpoint and change what the next iteration reads.
				p := newPartition(cfg)
				if err := p.recover(); err != nil {
					b.Fatal(err)
				}
				if n := p.st.Stats(0).Ready; n != recoverRecords {
					b.Fatalf("recovered %d ready, want %d", n, recoverRecords)
				}
				p.log.Close()
			}
			b.ReportMetric(float64(recoverRecords)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
