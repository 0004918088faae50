package auth

import (
	"bytes"
	"errors"
	"os"
	"reflect"
	"testing"

	"github.com/sinewmq/sinew/internal/ckfile"
	"github.com/sinewmq/sinew/internal/vfs"
)

// testdata/users-v1.json was written by the users store before it moved to
// internal/ckfile. It still loads, verifies passwords, and a write of the
// same users reproduces it byte for byte.
func TestUsersFixture(t *testing.T) {
	fixture, err := os.ReadFile("testdata/users-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	m := vfs.NewMem()
	if err := m.MkdirAll("d", vfs.DirPerm); err != nil {
		t.Fatal(err)
	}
	if err := m.WriteFile("d/users.json", fixture); err != nil {
		t.Fatal(err)
	}
	u, err := OpenUsersParams(m, "d/users.json", cheap)
	if err != nil {
		t.Fatal(err)
	}
	want := []UserInfo{
		{Name: "alice", Perms: Permissions{Publish: []string{"orders.*"}, Consume: []string{"orders.>"}}},
		{Name: "bob@ops", Perms: Permissions{Manage: []string{">"}}},
	}
	if got := u.List(); !reflect.DeepEqual(got, want) {
		t.Fatalf("users: %+v, want %+v", got, want)
	}
	if p, err := u.Verify("alice", "correct horse battery"); err != nil || p.Name != "alice" {
		t.Fatalf("alice's password: %+v %v", p, err)
	}
	if _, err := u.Verify("bob@ops", "wrong"); !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("a wrong password: %v", err)
	}
	// Two writes that end with the same users write the fixture again.
	if err := u.Add("carol", "another long password", Permissions{}); err != nil {
		t.Fatal(err)
	}
	if err := u.Remove("carol"); err != nil {
		t.Fatal(err)
	}
	got, err := m.ReadFile("d/users.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, fixture) {
		t.Fatalf("rewritten users file differs from the fixture:\n%s\nwant\n%s", got, fixture)
	}
	// A flipped bit is the store's ErrCorrupt and the file's CorruptError.
	if err := m.FlipBit("d/users.json", 10, 2); err != nil {
		t.Fatal(err)
	}
	_, err = OpenUsersParams(m, "d/users.json", cheap)
	if !errors.Is(err, ErrCorrupt) || !errors.Is(err, ckfile.ErrCorrupt) {
		t.Fatalf("flipped users file: %v", err)
	}
}
