package auth

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

// cheap keeps the tests fast; the parameters are recorded per hash, so the
// store behaves the same with the defaults.
var cheap = HashParams{TimeCost: 1, MemoryKiB: 64, Threads: 1}

const usersPath = "/data/meta/users"

func openCheap(t *testing.T, fsys vfs.FS) *Users {
	t.Helper()
	u, err := OpenUsersParams(fsys, usersPath, cheap)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestUsersVerify(t *testing.T) {
	u := openCheap(t, vfs.NewMem())
	perms := Permissions{Publish: []string{"orders.*"}}
	if err := u.Add("alice", "correct horse", perms); err != nil {
		t.Fatal(err)
	}
	p, err := u.Verify("alice", "correct horse")
	if err != nil {
		t.Fatalf("right password: %v", err)
	}
	if p.Name != "alice" || p.Kind != KindUser || p.All {
		t.Fatalf("principal = %+v", p)
	}
	if !p.Allows(ActionPublish, "orders.eu") || p.Allows(ActionConsume, "orders.eu") {
		t.Fatalf("principal permissions wrong: %+v", p.Perms)
	}
	for _, c := range []struct{ name, pw string }{
		{"alice", "correct hors"},
		{"alice", ""},
		{"alice", "correct horse" + strings.Repeat("x", PasswordBytesMax)},
		{"bob", "correct horse"},
		{"", ""},
	} {
		before := u.hashes.Load()
		p, err := u.Verify(c.name, c.pw)
		if !errors.Is(err, ErrAuthFailed) {
			t.Errorf("Verify(%q, %q) = %+v, %v; want ErrAuthFailed", c.name, c.pw, p, err)
		}
		// Every attempt, known name or not, costs exactly one hash.
		if n := u.hashes.Load() - before; n != 1 {
			t.Errorf("Verify(%q): %d hashes, want 1", c.name, n)
		}
	}
}

func TestUsersPersistAndParams(t *testing.T) {
	fsys := vfs.NewMem()
	u := openCheap(t, fsys)
	if err := u.Add("alice", "password1", Permissions{Consume: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	// Reopen with different parameters: alice's hash keeps its own.
	other := HashParams{TimeCost: 2, MemoryKiB: 128, Threads: 1}
	u2, err := OpenUsersParams(fsys, usersPath, other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u2.Verify("alice", "password1"); err != nil {
		t.Fatalf("after reopen: %v", err)
	}
	if err := u2.Add("bob", "password2", Permissions{}); err != nil {
		t.Fatal(err)
	}
	b, err := fsys.ReadFile(usersPath)
	if err != nil {
		t.Fatal(err)
	}
	f, err := decodeUsers(b)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]HashParams{}
	for _, r := range f.Users {
		got[r.Name] = r.Hash
	}
	if got["alice"] != cheap || got["bob"] != other {
		t.Fatalf("recorded params = %+v", got)
	}
	fi, err := fsys.Stat(usersPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("users file mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestUsersMutations(t *testing.T) {
	u := openCheap(t, vfs.NewMem())
	if err := u.Add("alice", "password1", Permissions{}); err != nil {
		t.Fatal(err)
	}
	if err := u.Add("alice", "password2", Permissions{}); !errors.Is(err, ErrUserExists) {
		t.Fatalf("second Add: %v", err)
	}
	for name, err := range map[string]error{
		"SetPassword":    u.SetPassword("bob", "password1"),
		"SetPermissions": u.SetPermissions("bob", Permissions{}),
		"Remove":         u.Remove("bob"),
	} {
		if !errors.Is(err, ErrUserNotFound) {
			t.Errorf("%s(bob) = %v, want ErrUserNotFound", name, err)
		}
	}
	if err := u.SetPermissions("alice", Permissions{Manage: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	if err := u.SetPassword("alice", "password9"); err != nil {
		t.Fatal(err)
	}
	if _, err := u.Verify("alice", "password1"); !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("old password after SetPassword: %v", err)
	}
	p, err := u.Verify("alice", "password9")
	if err != nil {
		t.Fatal(err)
	}
	// SetPassword keeps the permissions.
	if !p.Allows(ActionManage, "a") {
		t.Fatalf("permissions lost: %+v", p.Perms)
	}
	list := u.List()
	if len(list) != 1 || list[0].Name != "alice" || u.Len() != 1 {
		t.Fatalf("List = %+v", list)
	}
	js, _ := json.Marshal(list)
	if strings.Contains(string(js), "salt") || strings.Contains(string(js), "key") {
		t.Fatalf("List exposes hash material: %s", js)
	}
	if err := u.Remove("alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := u.Verify("alice", "password9"); !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("removed user verifies: %v", err)
	}
}

func TestUsersRejectsBadInput(t *testing.T) {
	u := openCheap(t, vfs.NewMem())
	for _, name := range []string{"", "a:b", "token#1", "al ice", "é", "x\n", strings.Repeat("a", NameBytesMax+1)} {
		if err := u.Add(name, "password1", Permissions{}); !errors.Is(err, ErrInvalidName) {
			t.Errorf("Add(%q) = %v, want ErrInvalidName", name, err)
		}
	}
	for _, pw := range []string{"", "short", strings.Repeat("p", PasswordBytesMax+1)} {
		if err := u.Add("alice", pw, Permissions{}); !errors.Is(err, ErrInvalidPassword) {
			t.Errorf("Add with %d-byte password = %v, want ErrInvalidPassword", len(pw), err)
		}
	}
	if err := u.Add("alice", "password1", Permissions{Publish: []string{"a*b"}}); err == nil {
		t.Error("bad pattern accepted")
	}
	many := Permissions{Publish: make([]string, PatternsMax+1)}
	for i := range many.Publish {
		many.Publish[i] = "t"
	}
	if err := u.Add("alice", "password1", many); err == nil {
		t.Error("too many patterns accepted")
	}
	if u.Len() != 0 {
		t.Fatalf("rejected adds left %d users", u.Len())
	}
	if _, err := OpenUsersParams(vfs.NewMem(), usersPath, HashParams{TimeCost: 1, MemoryKiB: 1 << 30, Threads: 1}); err == nil {
		t.Error("out-of-range params accepted")
	}
}

func TestUsersCorruptFile(t *testing.T) {
	fsys := vfs.NewMem()
	u := openCheap(t, fsys)
	if err := u.Add("alice", "password1", Permissions{}); err != nil {
		t.Fatal(err)
	}
	if err := fsys.FlipBit(usersPath, 20, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenUsersParams(fsys, usersPath, cheap); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("flipped bit: %v, want ErrCorrupt", err)
	}
	// A file with a valid checksum but hostile parameters is refused too.
	hostile := map[string]userRecord{"alice": {Name: "alice", Alg: algArgon2id,
		Hash: HashParams{TimeCost: 1, MemoryKiB: 1 << 31, Threads: 1}, Salt: make([]byte, 16), Key: make([]byte, 32)}}
	if err := fsys.WriteFile(usersPath, encodeUsers(hostile)); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenUsersParams(fsys, usersPath, cheap); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("hostile params: %v, want ErrCorrupt", err)
	}
	big := make([]byte, usersFileBytesMax+1)
	if err := fsys.WriteFile(usersPath, big); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenUsersParams(fsys, usersPath, cheap); !errors.Is(err, vfs.ErrTooLarge) {
		t.Fatalf("oversized file: %v, want ErrTooLarge", err)
	}
}

// TestUsersCrash: a change that returned nil survives a power loss at any
// later moment; a change that failed leaves the store as it was.
func TestUsersCrash(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		fsys := vfs.NewMem()
		// The data directory exists durably, as the broker leaves it.
		if err := fsys.MkdirAll("/data", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := fsys.SyncDir("/"); err != nil {
			t.Fatal(err)
		}
		u := openCheap(t, fsys)
		want := map[string]string{}
		n := 1 + rng.IntN(6)
		for i := range n {
			name := string(rune('a'+i)) + "user"
			pw := strings.Repeat(string(rune('0'+i)), 8)
			if err := u.Add(name, pw, Permissions{}); err != nil {
				t.Fatal(err)
			}
			want[name] = pw
		}
		// One more change that fails its sync: it must not be visible in
		// memory, and after the crash either state is allowed only for the
		// failed change.
		fsys.SetSyncError(errors.New("disk gone"))
		if err := u.Add("zuser", "zzzzzzzz", Permissions{}); err == nil {
			t.Fatal("Add with failing sync returned nil")
		}
		if _, err := u.Verify("zuser", "zzzzzzzz"); !errors.Is(err, ErrAuthFailed) {
			t.Fatalf("failed Add is visible: %v", err)
		}
		img := fsys.Crash(rng, true)
		u2, err := OpenUsersParams(img, usersPath, cheap)
		if err != nil {
			t.Fatalf("seed %d: reopen after crash: %v", seed, err)
		}
		for name, pw := range want {
			if _, err := u2.Verify(name, pw); err != nil {
				t.Fatalf("seed %d: confirmed user %s lost: %v", seed, name, err)
			}
		}
	}
}

func TestUsersConcurrent(t *testing.T) {
	u := openCheap(t, vfs.NewMem())
	if err := u.Add("alice", "password1", Permissions{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for range 10 {
				if _, err := u.Verify("alice", "password1"); err != nil {
					t.Error(err)
				}
			}
		})
		wg.Go(func() {
			name := "u" + string(rune('0'+i))
			if err := u.Add(name, "password1", Permissions{}); err != nil {
				t.Error(err)
			}
			u.List()
		})
	}
	wg.Wait()
	if u.Len() != 5 {
		t.Fatalf("Len = %d, want 5", u.Len())
	}
}

func TestUsersDefaultParams(t *testing.T) {
	if testing.Short() {
		t.Skip("full-cost argon2id")
	}
	u, err := OpenUsers(vfs.NewMem(), usersPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Add("alice", "password1", Permissions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := u.Verify("alice", "password1"); err != nil {
		t.Fatal(err)
	}
}

func TestPrincipal(t *testing.T) {
	var zero Principal
	if zero.Allows(ActionPublish, "t") {
		t.Error("zero principal allowed")
	}
	if !Anonymous().Allows(ActionManage, "t") || !TokenPrincipal(0).Allows(ActionConsume, "t") {
		t.Error("anonymous/token not All")
	}
	if TokenPrincipal(1).Name != "token#2" {
		t.Errorf("token label %q", TokenPrincipal(1).Name)
	}
	// A user is one session owner whether it logged in with its password
	// or its client certificate; a token of the same text is another.
	user := Principal{Name: "x", Kind: KindUser}
	cert := Principal{Name: "x", Kind: KindCertificate}
	token := Principal{Name: "x", Kind: KindToken}
	if user.Owner() != cert.Owner() || user.Owner() == token.Owner() || Anonymous().Owner() != "anonymous:" {
		t.Errorf("owners: user %q cert %q token %q anonymous %q", user.Owner(), cert.Owner(), token.Owner(), Anonymous().Owner())
	}
}
