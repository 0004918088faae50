package checker

import (
	"errors"
	"testing"

	"pgregory.net/rapid"
)

func TestBodyRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		want := ID{
			Producer: rapid.StringN(0, 20, 255).Draw(t, "producer"),
			Seq:      rapid.Uint64().Draw(t, "seq"),
		}
		b, err := AppendBody([]byte("prefix"), want, rapid.IntRange(0, 300).Draw(t, "pad"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeBody(b[len("prefix"):])
		if err != nil || got != want {
			t.Fatalf("DecodeBody = %v, %v; want %v", got, err, want)
		}
	})
}

func TestBodyDetectsDamage(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b, err := AppendBody(nil, ID{"p", rapid.Uint64().Draw(t, "seq")}, rapid.IntRange(0, 64).Draw(t, "pad"))
		if err != nil {
			t.Fatal(err)
		}
		switch rapid.IntRange(0, 1).Draw(t, "how") {
		case 0: // flip one bit
			i := rapid.IntRange(0, len(b)-1).Draw(t, "byte")
			b[i] ^= 1 << rapid.IntRange(0, 7).Draw(t, "bit")
		case 1: // cut the tail
			b = b[:rapid.IntRange(0, len(b)-1).Draw(t, "len")]
		}
		if _, err := DecodeBody(b); !errors.Is(err, ErrBadBody) {
			t.Fatalf("damaged body decoded: err=%v", err)
		}
	})
}

func TestBodyLimits(t *testing.T) {
	if _, err := AppendBody(nil, ID{Producer: string(make([]byte, 256))}, 0); err == nil {
		t.Fatal("256-byte producer accepted")
	}
	if _, err := AppendBody(nil, ID{Producer: "p"}, bodyPaddingMax+1); err == nil {
		t.Fatal("oversized padding accepted")
	}
	if _, err := AppendBody(nil, ID{Producer: "p"}, -1); err == nil {
		t.Fatal("negative padding accepted")
	}
}
