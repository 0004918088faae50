package ckfile

import (
	"bytes"
	"errors"
	"io/fs"
	"math/rand/v2"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

var sample = []byte(`{"v":1,"topic":"orders","group":"","partitions":3}`)

// The frame is the payload's line then "crc32c " and eight lowercase hex
// digits: the bytes that internal/auth and internal/broker have always
// written (their testdata fixtures check it against real files).
func TestEncodeFormat(t *testing.T) {
	got := Encode([]byte(`{}`))
	// The value was checked against a bitwise CRC-32C outside Go.
	if want := "{}\ncrc32c 297bd0aa\n"; string(got) != want {
		t.Fatalf("Encode({}) = %q, want %q", got, want)
	}
	p, err := Decode(got)
	if err != nil || string(p) != "{}" {
		t.Fatalf("Decode: %q %v", p, err)
	}
}

func TestDecodeRefuses(t *testing.T) {
	good := Encode(sample)
	for _, c := range []struct {
		name, reason string
		b            []byte
	}{
		{"empty", "no checksum line", nil},
		{"no newline", "no checksum line", sample},
		{"no prefix", "malformed checksum line", append(append(bytes.Clone(sample), '\n'), "crc 00000000\n"...)},
		{"not hex", "malformed checksum: ", append(append(bytes.Clone(sample), '\n'), "crc32c zz\n"...)},
		{"too wide", "malformed checksum: ", append(append(bytes.Clone(sample), '\n'), "crc32c 123456789\n"...)},
		{"mismatch", "checksum mismatch", append(append([]byte(`{"v":2`), sample[6:]...), good[len(sample):]...)},
		{"trailing junk", "malformed checksum: ", append(bytes.Clone(good), 'x')},
	} {
		_, err := Decode(c.b)
		var ce *CorruptError
		if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || !bytes.HasPrefix([]byte(ce.Reason), []byte(c.reason)) {
			t.Errorf("%s: %v, want a CorruptError %q", c.name, err, c.reason)
		}
	}
}

// Every single-bit flip is refused, except those that leave the same
// checksum value (a hex letter's case), which decode to the same payload.
func TestEveryBitFlip(t *testing.T) {
	good := Encode(sample)
	for i := range len(good) * 8 {
		b := bytes.Clone(good)
		b[i/8] ^= 1 << (i % 8)
		p, err := Decode(b)
		if err == nil && !bytes.Equal(p, sample) {
			t.Fatalf("flip of bit %d decoded to %q", i, p)
		}
		if err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flip of bit %d: untyped error %v", i, err)
		}
	}
}

func TestEncodeRefusesNewline(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Encode took a payload with a newline")
		}
	}()
	Encode([]byte("a\nb"))
}

func TestReadWrite(t *testing.T) {
	m := vfs.NewMem()
	if err := m.MkdirAll("d", vfs.DirPerm); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(m, "d/f", 1<<10); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if err := Write(m, "d/f", sample); err != nil {
		t.Fatal(err)
	}
	if p, err := Read(m, "d/f", 1<<10); err != nil || !bytes.Equal(p, sample) {
		t.Fatalf("read back: %q %v", p, err)
	}
	if _, err := Read(m, "d/f", 10); !errors.Is(err, vfs.ErrTooLarge) {
		t.Fatalf("over the bound: %v", err)
	}
	if err := m.FlipBit("d/f", 3, 1); err != nil {
		t.Fatal(err)
	}
	_, err := Read(m, "d/f", 1<<10)
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Name != "d/f" || err.Error() != "d/f: checksum mismatch" {
		t.Fatalf("flipped file: %v", err)
	}
	if err := WritePrivate(m, "d/secret", sample); err != nil {
		t.Fatal(err)
	}
	if fi, err := m.Stat("d/secret"); err != nil || fi.Mode().Perm()&0o077 != 0 {
		t.Fatalf("private file: %v %v", fi, err)
	}
}

// A write that returned nil survives a crash; one that failed leaves the
// previous contents, whole.
func TestWriteCrash(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		m := vfs.NewMem()
		if err := m.MkdirAll("d", vfs.DirPerm); err != nil {
			t.Fatal(err)
		}
		if err := m.SyncDir("."); err != nil {
			t.Fatal(err)
		}
		if err := Write(m, "d/f", []byte(`{"n":1}`)); err != nil {
			t.Fatal(err)
		}
		want := []byte(`{"n":1}`)
		if rng.IntN(2) == 0 {
			if err := Write(m, "d/f", []byte(`{"n":2}`)); err != nil {
				t.Fatal(err)
			}
			want = []byte(`{"n":2}`)
		} else {
			m.SetSyncError(errors.New("disk gone"))
			if err := Write(m, "d/f", []byte(`{"n":2}`)); err == nil {
				t.Fatal("write with failing fsync returned nil")
			}
		}
		after := m.Crash(rng, true)
		if p, err := Read(after, "d/f", 1<<10); err != nil || !bytes.Equal(p, want) {
			t.Fatalf("seed %d: after the crash %q %v, want %q", seed, p, err, want)
		}
	}
}
