package auth

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/argon2"

	"github.com/sinewmq/sinew/internal/ckfile"
	"github.com/sinewmq/sinew/internal/vfs"
)

// Errors of the users store. Callers match them with errors.Is.
var (
	// ErrAuthFailed is the one answer to a wrong user name or password:
	// Verify never says which of the two was wrong.
	ErrAuthFailed = errors.New("auth: authentication failed")
	// ErrUserExists is returned by Add for a name already in the store.
	ErrUserExists = errors.New("auth: user already exists")
	// ErrUserNotFound is returned for a name not in the store.
	ErrUserNotFound = errors.New("auth: user not found")
	// ErrInvalidName wraps a rejected user name.
	ErrInvalidName = errors.New("auth: invalid user name")
	// ErrInvalidPassword wraps a rejected password (too short or too long).
	ErrInvalidPassword = errors.New("auth: invalid password")
	// ErrTooManyUsers is returned by Add when the store holds UsersMax users.
	ErrTooManyUsers = errors.New("auth: too many users")
	// ErrCorrupt wraps a users file that cannot be trusted.
	ErrCorrupt = errors.New("auth: users file corrupt")
	// ErrBusy is returned by VerifyFrom when its context ended before a
	// hash slot was free: the password was not checked, so it is neither
	// right nor wrong, and the caller answers "busy, retry" rather than a
	// failed login.
	ErrBusy = errors.New("auth: every password hash slot stayed busy until the deadline")
)

// Limits of the users store. They bound the file, the memory it takes and
// the work one login can cost.
const (
	// UsersMax is the most users one broker holds.
	UsersMax = 10000
	// NameBytesMax is the longest user name.
	NameBytesMax = 64
	// PasswordBytesMin is the shortest password Add and SetPassword
	// accept.
	PasswordBytesMin = 8
	// PasswordBytesMax is the longest password; longer ones are refused
	// rather than silently cut.
	PasswordBytesMax = 1024
	// PatternsMax is the most topic patterns one user's permissions hold,
	// over all actions.
	PatternsMax = 1000
	// usersFileBytesMax bounds the file read at open: UsersMax users with
	// room for their permissions.
	usersFileBytesMax = 64 << 20
)

// HashParams are argon2id parameters. Each stored hash records the ones it
// was made with, so raising the defaults later leaves old hashes verifiable.
type HashParams struct {
	// TimeCost is argon2's number of passes.
	TimeCost uint32 `json:"t"`
	// MemoryKiB is the memory one hash uses, in KiB.
	MemoryKiB uint32 `json:"m"`
	// Threads is argon2's parallelism.
	Threads uint8 `json:"p"`
}

// DefaultHashParams follow the OWASP password storage recommendation for
// argon2id (19 MiB, 2 passes, 1 lane): about 30 ms per hash on one core.
var DefaultHashParams = HashParams{TimeCost: 2, MemoryKiB: 19 * 1024, Threads: 1}

// Bounds on stored parameters, so a damaged or hostile users file cannot make
// a login allocate gigabytes or spin for minutes.
const (
	timeCostMax  = 16
	memoryKiBMax = 1 << 20 // 1 GiB
	threadsMax   = 16
	saltBytes    = 16
	keyBytes     = 32
)

func (p HashParams) check() error {
	if p.TimeCost == 0 || p.TimeCost > timeCostMax || p.MemoryKiB < 8*uint32(p.Threads) ||
		p.MemoryKiB > memoryKiBMax || p.Threads == 0 || p.Threads > threadsMax {
		return fmt.Errorf("hash parameters t=%d m=%d p=%d out of range", p.TimeCost, p.MemoryKiB, p.Threads)
	}
	return nil
}

// UserInfo is what List reports about a user: never the hash.
type UserInfo struct {
	Name  string      `json:"name"`
	Perms Permissions `json:"permissions"`
}

// userRecord is one user as stored.
type userRecord struct {
	Name  string      `json:"name"`
	Alg   string      `json:"alg"` // "argon2id"
	Hash  HashParams  `json:"params"`
	Salt  []byte      `json:"salt"` // base64 in JSON
	Key   []byte      `json:"key"`
	Perms Permissions `json:"permissions"`
}

// usersFile is the on-disk form, a checksummed file (internal/ckfile)
// written atomically as
//
//	{"v":1,"users":[{"name":"alice","alg":"argon2id","params":{"t":2,"m":19456,"p":1},
//	                 "salt":"<base64>","key":"<base64>","permissions":{...}}, ...]}\n
//	crc32c 1a2b3c4d\n          CRC-32C (Castagnoli) of the JSON line, hex
//
// Users are sorted by name so the same store always writes the same bytes.
type usersFile struct {
	Version int          `json:"v"`
	Users   []userRecord `json:"users"`
}

const (
	usersVersion = 1
	algArgon2id  = "argon2id"
)

// Users is the persistent store of named users. See the package doc for its
// file and locking.
type Users struct {
	fs     vfs.FS
	path   string
	params HashParams

	writeMu  sync.Mutex // serialises mutations, held across the file write
	dirReady bool       // under writeMu: the file's directory exists durably

	mu    sync.RWMutex // guards users
	users map[string]userRecord

	slots    *hashSlots // bounds the hashes in progress, failed sources last
	suspects suspects   // sources whose check failed lately
	now      func() time.Time
	onHash   func()
	hashes   atomic.Int64 // hashes computed, for tests
	dummy    userRecord   // hashed against for unknown users
}

// UsersOptions tune a users store. The zero value is the default.
type UsersOptions struct {
	// Params are the argon2id parameters new hashes use; zero means
	// DefaultHashParams. Tests pass cheap ones; existing hashes keep the
	// parameters they record.
	Params HashParams
	// HashesMax is how many password hashes run at once
	// (auth.password_hashes_max), 1 to HashesMaxLimit; 0 means
	// HashesMaxDefault. It bounds the memory and the cores a flood of
	// logins can take.
	HashesMax int
	// Now reads the clock for SuspectWindow; nil means time.Now.
	Now func() time.Time
	// OnHash, when set, is called with a hash slot held, just before each
	// hash. Tests block in it to keep a slot busy.
	OnHash func()
}

// OpenUsers opens the store at path (created on the first change) with
// DefaultHashParams for new hashes.
func OpenUsers(fsys vfs.FS, path string) (*Users, error) {
	return OpenUsersWith(fsys, path, UsersOptions{})
}

// OpenUsersParams is OpenUsers with the argon2id parameters new hashes use.
// Tests pass cheap ones; existing hashes keep the parameters they record.
func OpenUsersParams(fsys vfs.FS, path string, params HashParams) (*Users, error) {
	return OpenUsersWith(fsys, path, UsersOptions{Params: params})
}

// OpenUsersWith is OpenUsers with options.
func OpenUsersWith(fsys vfs.FS, path string, opts UsersOptions) (*Users, error) {
	params := opts.Params
	if params == (HashParams{}) {
		params = DefaultHashParams
	}
	if err := params.check(); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	n := opts.HashesMax
	if n == 0 {
		n = HashesMaxDefault
	}
	if n < 1 || n > HashesMaxLimit {
		return nil, fmt.Errorf("auth: %d password hashes at once, want 1 to %d", n, HashesMaxLimit)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	u := &Users{
		fs: fsys, path: path, params: params,
		users: make(map[string]userRecord),
		slots: newHashSlots(n), now: now, onHash: opts.OnHash,
	}
	// The dummy record makes a login as an unknown user cost one hash with
	// the current parameters, like a known one, so timing does not tell
	// which names exist.
	salt := make([]byte, saltBytes)
	rand.Read(salt)
	u.dummy = userRecord{Alg: algArgon2id, Hash: params, Salt: salt, Key: make([]byte, keyBytes)}

	js, err := ckfile.Read(fsys, path, usersFileBytesMax)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return u, nil
	case errors.Is(err, ckfile.ErrCorrupt):
		// err names the file.
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	case err != nil:
		return nil, fmt.Errorf("auth: read users: %w", err)
	}
	f, err := decodeUsersJSON(js)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	for _, r := range f.Users {
		u.users[r.Name] = r
	}
	return u, nil
}

// decodeUsers verifies and decodes a whole users file.
func decodeUsers(b []byte) (*usersFile, error) {
	js, err := ckfile.Decode(b)
	if err != nil {
		return nil, err
	}
	return decodeUsersJSON(js)
}

// decodeUsersJSON decodes and checks a verified users payload.
func decodeUsersJSON(js []byte) (*usersFile, error) {
	var f usersFile
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, err
	}
	if f.Version != usersVersion {
		return nil, fmt.Errorf("version %d, want %d", f.Version, usersVersion)
	}
	if len(f.Users) > UsersMax {
		return nil, fmt.Errorf("%d users, at most %d", len(f.Users), UsersMax)
	}
	seen := make(map[string]bool, len(f.Users))
	for _, r := range f.Users {
		// Checked at read time as well as write time: the file is trusted
		// only as far as these checks go.
		if err := checkName(r.Name); err != nil {
			return nil, err
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("user %q twice", r.Name)
		}
		seen[r.Name] = true
		if r.Alg != algArgon2id {
			return nil, fmt.Errorf("user %q: unknown algorithm %q", r.Name, r.Alg)
		}
		if err := r.Hash.check(); err != nil {
			return nil, fmt.Errorf("user %q: %v", r.Name, err)
		}
		if len(r.Salt) < saltBytes || len(r.Salt) > 64 || len(r.Key) < 16 || len(r.Key) > 64 {
			return nil, fmt.Errorf("user %q: salt or key length out of range", r.Name)
		}
		if err := checkPerms(r.Perms); err != nil {
			return nil, fmt.Errorf("user %q: %v", r.Name, err)
		}
	}
	return &f, nil
}

// encodeUsers is the whole users file for users.
func encodeUsers(users map[string]userRecord) []byte { return ckfile.Encode(usersJSON(users)) }

// usersJSON is the users file's payload for users.
func usersJSON(users map[string]userRecord) []byte {
	f := usersFile{Version: usersVersion, Users: make([]userRecord, 0, len(users))}
	for _, r := range users {
		f.Users = append(f.Users, r)
	}
	sort.Slice(f.Users, func(i, j int) bool { return f.Users[i].Name < f.Users[j].Name })
	js, err := json.Marshal(&f)
	if err != nil {
		panic("auth: users file does not marshal: " + err.Error())
	}
	return js
}

// checkName accepts 1..NameBytesMax bytes of ASCII letters, digits and
// "._-@". Keeping names this plain means they can never carry a ':' (the
// HTTP basic-auth separator), a '#' (token labels), control characters into
// logs, or look-alike Unicode.
func checkName(name string) error {
	if name == "" || len(name) > NameBytesMax {
		return fmt.Errorf("%w: %d bytes, want 1..%d", ErrInvalidName, len(name), NameBytesMax)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			c == '.', c == '_', c == '-', c == '@':
		default:
			return fmt.Errorf("%w: %q: only letters, digits and . _ - @", ErrInvalidName, name)
		}
	}
	return nil
}

func checkPassword(password string) error {
	if len(password) < PasswordBytesMin || len(password) > PasswordBytesMax {
		return fmt.Errorf("%w: %d bytes, want %d..%d", ErrInvalidPassword, len(password), PasswordBytesMin, PasswordBytesMax)
	}
	return nil
}

func checkPerms(p Permissions) error {
	if n := len(p.Publish) + len(p.Consume) + len(p.Manage); n > PatternsMax {
		return fmt.Errorf("auth: %d topic patterns, at most %d", n, PatternsMax)
	}
	return p.Validate()
}

// hash computes the argon2id key of password under r's salt and parameters,
// waiting for a hash slot (behind the clean sources when suspect) so at
// most the configured number run at once. It returns ErrBusy, having
// hashed nothing, when ctx ends first.
func (u *Users) hash(ctx context.Context, suspect bool, r *userRecord, password string) ([]byte, error) {
	if err := u.slots.acquire(ctx, suspect); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBusy, err)
	}
	defer u.slots.release()
	if u.onHash != nil {
		u.onHash()
	}
	u.hashes.Add(1)
	return argon2.IDKey([]byte(password), r.Salt, r.Hash.TimeCost, r.Hash.MemoryKiB, r.Hash.Threads, uint32(len(r.Key))), nil
}

// newRecord hashes password with a fresh salt and the store's parameters.
func (u *Users) newRecord(name, password string, perms Permissions) (userRecord, error) {
	salt := make([]byte, saltBytes)
	if _, err := rand.Read(salt); err != nil {
		return userRecord{}, err
	}
	r := userRecord{Name: name, Alg: algArgon2id, Hash: u.params, Salt: salt, Key: make([]byte, keyBytes), Perms: clonePerms(perms)}
	// An administrator's change waits as long as it takes, as a clean
	// source: it is no guess.
	key, err := u.hash(context.Background(), false, &r, password)
	if err != nil {
		return userRecord{}, err
	}
	r.Key = key
	return r, nil
}

// update applies fn to a copy of the table and, if fn succeeds, writes the
// copy to disk and then makes it current. A failed write leaves both the file
// and the table as they were.
func (u *Users) update(fn func(users map[string]userRecord) error) error {
	u.writeMu.Lock()
	defer u.writeMu.Unlock()
	u.mu.RLock()
	next := make(map[string]userRecord, len(u.users)+1)
	for k, v := range u.users {
		next[k] = v
	}
	u.mu.RUnlock()
	if err := fn(next); err != nil {
		return err
	}
	if !u.dirReady {
		// The directory may be new: make its entry durable in its parent
		// before the file's rename is made durable inside it.
		dir := filepath.Dir(u.path)
		if err := u.fs.MkdirAll(dir, vfs.DirPerm); err != nil {
			return fmt.Errorf("auth: write users: %w", err)
		}
		if err := u.fs.SyncDir(filepath.Dir(dir)); err != nil {
			return fmt.Errorf("auth: write users: %w", err)
		}
		u.dirReady = true
	}
	// 0600: the file holds password hashes, which are worth cracking
	// offline.
	if err := ckfile.WritePrivate(u.fs, u.path, usersJSON(next)); err != nil {
		return fmt.Errorf("auth: write users: %w", err)
	}
	u.mu.Lock()
	u.users = next
	u.mu.Unlock()
	return nil
}

// Add creates a user. It is durable when Add returns nil.
func (u *Users) Add(name, password string, perms Permissions) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := checkPassword(password); err != nil {
		return err
	}
	if err := checkPerms(perms); err != nil {
		return err
	}
	// Hash before taking the write lock: it is the slow part.
	r, err := u.newRecord(name, password, perms)
	if err != nil {
		return err
	}
	return u.update(func(users map[string]userRecord) error {
		if _, ok := users[name]; ok {
			return fmt.Errorf("%w: %q", ErrUserExists, name)
		}
		if len(users) >= UsersMax {
			return fmt.Errorf("%w: at most %d", ErrTooManyUsers, UsersMax)
		}
		users[name] = r
		return nil
	})
}

// SetPassword replaces a user's password (new salt, current parameters).
func (u *Users) SetPassword(name, password string) error {
	if err := checkPassword(password); err != nil {
		return err
	}
	r, err := u.newRecord(name, password, Permissions{})
	if err != nil {
		return err
	}
	return u.update(func(users map[string]userRecord) error {
		old, ok := users[name]
		if !ok {
			return fmt.Errorf("%w: %q", ErrUserNotFound, name)
		}
		r.Perms = old.Perms
		users[name] = r
		return nil
	})
}

// SetPermissions replaces a user's permissions. Connections already
// authenticated keep the permissions they logged in with.
func (u *Users) SetPermissions(name string, perms Permissions) error {
	if err := checkPerms(perms); err != nil {
		return err
	}
	return u.update(func(users map[string]userRecord) error {
		r, ok := users[name]
		if !ok {
			return fmt.Errorf("%w: %q", ErrUserNotFound, name)
		}
		r.Perms = clonePerms(perms)
		users[name] = r
		return nil
	})
}

// Remove deletes a user. Connections already authenticated as that user
// stay open; new logins fail.
func (u *Users) Remove(name string) error {
	return u.update(func(users map[string]userRecord) error {
		if _, ok := users[name]; !ok {
			return fmt.Errorf("%w: %q", ErrUserNotFound, name)
		}
		delete(users, name)
		return nil
	})
}

// List returns every user's name and permissions, sorted by name.
func (u *Users) List() []UserInfo {
	u.mu.RLock()
	out := make([]UserInfo, 0, len(u.users))
	for _, r := range u.users {
		out = append(out, UserInfo{Name: r.Name, Perms: clonePerms(r.Perms)})
	}
	u.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Len returns the number of users. The startup rule treats a store with
// users as "auth configured".
func (u *Users) Len() int {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return len(u.users)
}

// Certificate returns the principal of a peer whose verified client
// certificate names user name (tls.client_cert_user): kind certificate, with
// that user's permissions. The TLS handshake already proved the peer holds
// the certificate, so no password is checked. A name that is no user gives
// ErrAuthFailed: permissions live in the users store only.
func (u *Users) Certificate(name string) (Principal, error) {
	u.mu.RLock()
	r, ok := u.users[name]
	u.mu.RUnlock()
	if !ok {
		return Principal{}, ErrAuthFailed
	}
	return Principal{Name: r.Name, Kind: KindCertificate, Perms: clonePerms(r.Perms)}, nil
}

// Verify checks a user name and password and returns the user's Principal.
// Every failure is ErrAuthFailed, and an unknown name costs the same hash
// as a known one; the comparison is constant-time. It waits for a hash slot
// as long as it takes; logins from the network use VerifyFrom.
func (u *Users) Verify(name, password string) (Principal, error) {
	return u.VerifyFrom(context.Background(), "", name, password)
}

// VerifyFrom is Verify for a login from source, a source address ("" for
// none), waiting for a hash slot at most until ctx ends: then it returns an
// error wrapping ErrBusy, having checked nothing and recorded nothing. A
// source whose check failed in the last SuspectWindow waits behind every
// source whose did not, so guessers do not keep others' logins waiting.
func (u *Users) VerifyFrom(ctx context.Context, source, name, password string) (Principal, error) {
	u.mu.RLock()
	r, ok := u.users[name]
	u.mu.RUnlock()
	if !ok {
		r = u.dummy
	}
	// An over-long password is still hashed (cut to the bound) so that
	// length does not show in the timing either; it can never match,
	// because Add refuses passwords over the bound.
	pw := password
	if len(pw) > PasswordBytesMax {
		pw = pw[:PasswordBytesMax]
	}
	got, err := u.hash(ctx, u.suspects.is(source, u.now()), &r, pw)
	if err != nil {
		return Principal{}, err
	}
	match := subtle.ConstantTimeCompare(got, r.Key) == 1
	if !ok || !match || len(password) > PasswordBytesMax {
		u.suspects.note(source, u.now())
		return Principal{}, ErrAuthFailed
	}
	return Principal{Name: r.Name, Kind: KindUser, Perms: clonePerms(r.Perms)}, nil
}

func clonePerms(p Permissions) Permissions {
	return Permissions{
		Publish: append([]string(nil), p.Publish...),
		Consume: append([]string(nil), p.Consume...),
		Manage:  append([]string(nil), p.Manage...),
	}
}
