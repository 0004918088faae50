package membership

import (
	"errors"
	"testing"
	"time"
)

// detectionFromMemberlist computes the worst-case detection from the
// memberlist configuration New hands to memberlist, not from the Profile,
// so a mapping mistake in memberlistConfig shows up here.
func detectionFromMemberlist(t *testing.T, p Profile) (direct, indirect, suspicion time.Duration) {
	t.Helper()
	cfg := Config{Meta: Meta{NodeID: "n1"}, Profile: p}
	mc := cfg.memberlistConfig(newMetaDelegate(nil), &Membership{})
	if mc.AwarenessMaxMultiplier != 1 {
		t.Fatalf("awareness multiplier %d stretches the probe interval", mc.AwarenessMaxMultiplier)
	}
	if k := mc.SuspicionMult - 2; k > 0 {
		t.Fatalf("suspicion multiplier %d makes memberlist wait for %d confirmations", mc.SuspicionMult, k)
	}
	return mc.ProbeTimeout, mc.ProbeInterval - mc.ProbeTimeout, time.Duration(mc.SuspicionMult) * mc.ProbeInterval
}

func TestSeedProfileDetection(t *testing.T) {
	p := SeedProfile()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	direct, indirect, suspicion := detectionFromMemberlist(t, p)
	if direct != 5*time.Second || indirect != 3*time.Second {
		t.Errorf("direct %v, indirect %v; the seed has 5s and 3s", direct, indirect)
	}
	if p.IndirectChecks != 3 {
		t.Errorf("indirect helpers %d, the seed has 3", p.IndirectChecks)
	}
	worst := direct + indirect + suspicion
	for n := 1; n <= 10; n++ {
		if got := p.WorstCaseDetection(n); got != worst {
			t.Errorf("n=%d: WorstCaseDetection %v, memberlist config gives %v", n, got, worst)
		}
	}
	// The seed's bound is 5 + 3 + 10 = 18 s.
	if worst > 18*time.Second || worst < 15*time.Second {
		t.Errorf("worst-case detection %v, want about the seed's 18s and not above", worst)
	}
	if worst != 16*time.Second {
		t.Errorf("worst-case detection %v, the doc says 16s", worst)
	}
	// Beyond ten nodes memberlist scales suspicion by log10(n).
	if got, want := p.SuspicionTimeout(100), 2*p.SuspicionTimeout(10); got != want {
		t.Errorf("suspicion at 100 nodes %v, want %v", got, want)
	}
}

func TestLANProfile(t *testing.T) {
	p := LANProfile()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	direct, indirect, suspicion := detectionFromMemberlist(t, p)
	if p.ProbeInterval >= time.Second {
		t.Errorf("probe interval %v is not sub-second", p.ProbeInterval)
	}
	if got := p.WorstCaseDetection(5); got != direct+indirect+suspicion || got != 1500*time.Millisecond {
		t.Errorf("WorstCaseDetection %v, config gives %v, doc says 1.5s", got, direct+indirect+suspicion)
	}
}

func TestProfileValidate(t *testing.T) {
	for name, mut := range map[string]func(*Profile){
		"no timeout":           func(p *Profile) { p.ProbeTimeout = 0 },
		"interval <= timeout":  func(p *Profile) { p.ProbeInterval = p.ProbeTimeout },
		"negative helpers":     func(p *Profile) { p.IndirectChecks = -1 },
		"zero suspicion":       func(p *Profile) { p.SuspicionMult = 0 },
		"zero reconnect":       func(p *Profile) { p.ReconnectInterval = 0 },
		"huge suspicion mult":  func(p *Profile) { p.SuspicionMult = 1000 },
		"many indirect checks": func(p *Profile) { p.IndirectChecks = 17 },
	} {
		p := LANProfile()
		mut(&p)
		if err := p.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%s: Validate = %v, want ErrBadConfig", name, err)
		}
		if _, err := New(Config{Meta: Meta{NodeID: "x"}, Profile: p}); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%s: New = %v, want ErrBadConfig", name, err)
		}
	}
	if _, err := New(Config{Profile: LANProfile()}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("empty node id: New = %v, want ErrBadConfig", err)
	}
}

func TestMetaRoundTrip(t *testing.T) {
	in := Meta{NodeID: "node-7f3a", ClientAddr: "10.0.0.1:7400", PeerAddr: "10.0.0.1:7401", Boot: 0x0102030405060708}
	b, err := in.encode()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > metaBytesMax {
		t.Fatalf("%d bytes over memberlist's %d", len(b), metaBytesMax)
	}
	out, err := decodeMeta(b)
	if err != nil || out != in {
		t.Fatalf("decode = %+v, %v; want %+v", out, err, in)
	}
	long := string(make([]byte, fieldBytesMax+1))
	if _, err := (Meta{NodeID: "a", PeerAddr: long}).encode(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("over-long field: %v, want ErrBadConfig", err)
	}
	full := Meta{NodeID: long[:fieldBytesMax], ClientAddr: long[:fieldBytesMax], PeerAddr: long[:fieldBytesMax], Boot: ^uint64(0)}
	if b, err := full.encode(); err != nil || len(b) > metaBytesMax {
		t.Errorf("largest meta: %d bytes, %v", len(b), err)
	}
	for i := range b {
		if _, err := decodeMeta(b[:i]); !errors.Is(err, ErrBadMeta) {
			t.Errorf("truncated to %d: %v, want ErrBadMeta", i, err)
		}
	}
	if _, err := decodeMeta(append(b, 0)); !errors.Is(err, ErrBadMeta) {
		t.Errorf("trailing byte: %v", err)
	}
	if _, err := decodeMeta([]byte{0, 0}); !errors.Is(err, ErrBadMeta) {
		t.Errorf("version 0: %v", err)
	}
	// A later version is version 2 with more appended (a field, a flag
	// this release does not know): its version 2 fields are read, the
	// rest is ignored. Truncated within version 2's fields, it is bad.
	later := append([]byte{metaVersion + 1, b[1] | 0x80}, b[2:]...)
	later = append(later, 0xaa, 0xbb)
	if m, err := decodeMeta(later); err != nil || m != in {
		t.Errorf("a later version: %+v, %v; want %+v", m, err, in)
	}
	for i := range len(b) {
		if _, err := decodeMeta(later[:i]); !errors.Is(err, ErrBadMeta) {
			t.Errorf("a later version truncated to %d: %v, want ErrBadMeta", i, err)
		}
	}
	if _, err := decodeMeta(append([]byte{metaVersion, b[1] | 0x80}, b[2:]...)); !errors.Is(err, ErrBadMeta) {
		t.Errorf("version 2 with an unknown flag: %v", err)
	}
	// Version 1 (no boot) is still read, from a node not yet upgraded.
	v1 := []byte{metaVersionV1, flagLeaving, 1, 'n', 1, 'c', 1, 'p'}
	if m, err := decodeMeta(v1); err != nil || m != (Meta{NodeID: "n", ClientAddr: "c", PeerAddr: "p", Leaving: true}) {
		t.Errorf("version 1: %+v, %v", m, err)
	}
	if _, err := decodeMeta(append(v1, 0)); !errors.Is(err, ErrBadMeta) {
		t.Errorf("version 1 with a trailing byte: %v", err)
	}
}

func FuzzDecodeMeta(f *testing.F) {
	b, _ := Meta{NodeID: "n", ClientAddr: "c", PeerAddr: "p", Boot: 7}.encode()
	f.Add(b)
	f.Add([]byte{1, 255})
	f.Add([]byte{metaVersionV1, 0, 1, 'n', 1, 'c', 1, 'p'})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			return
		}
		again, err := m.encode()
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		if b[0] != metaVersion {
			// Read as version 1, or as the version 2 prefix of a later
			// version; sent as the current version.
			if m2, err := decodeMeta(again); err != nil || m2 != m {
				t.Fatalf("version %d %x: re-encoded %x decodes to %+v, %v", b[0], b, again, m2, err)
			}
			return
		}
		if string(again) != string(b) {
			t.Fatalf("re-encoding %x gives %x", b, again)
		}
	})
}
