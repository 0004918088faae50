package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/vfs"
)

// `sinew admin user ...` manages the broker's users: through the admin API
// of a running broker (/api/v1/users), or, with --data-dir, directly in the
// users store of a stopped broker's data dir. The offline path is how an
// operator creates the first user of a broker that will listen on a public
// address (it refuses to start without auth); it takes the data dir's lock,
// so it fails at once, naming the holder, while a broker runs there.
//
// A new password is never a flag (argv shows in the process list and shell
// history): it is the first line of standard input with --password-stdin,
// or the environment variable SINEW_NEW_PASSWORD. SINEW_PASSWORD stays the
// password of the administrator running the command (--user).

// newPasswordEnv holds the password a user add or passwd sets, when
// --password-stdin is not given.
const newPasswordEnv = "SINEW_NEW_PASSWORD"

func init() {
	// For the usage listing; runAdmin dispatches "user" itself, because its
	// verbs read standard input.
	adminCommands["user"] = adminCommand{summary: "users and their permissions: list | show | add | passwd | grant | revoke | remove", verbs: userCommands(nil)}
}

func userCommands(stdin io.Reader) map[string]adminCommand {
	with := func(run func(ctx context.Context, name string, args []string, stdin io.Reader, stdout, stderr io.Writer) error) func(context.Context, string, []string, io.Writer, io.Writer) error {
		return func(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
			return run(ctx, name, args, stdin, stdout, stderr)
		}
	}
	return map[string]adminCommand{
		"list":   {summary: "every user with their permissions", run: with(adminUserList)},
		"show":   {summary: "one user's permissions: show NAME", run: with(adminUserShow)},
		"add":    {summary: "create a user: add NAME [--publish P]... [--consume P]... [--manage P]... with --password-stdin or SINEW_NEW_PASSWORD", run: with(adminUserAdd)},
		"passwd": {summary: "set a user's password: passwd NAME with --password-stdin or SINEW_NEW_PASSWORD", run: with(adminUserPasswd)},
		"grant":  {summary: "add topic patterns to a user's permissions: grant NAME [--publish P]... [--consume P]... [--manage P]...", run: with(adminUserGrant)},
		"revoke": {summary: "remove topic patterns from a user's permissions (as written): revoke NAME [--publish P]...", run: with(adminUserRevoke)},
		"remove": {summary: "delete a user: remove NAME", run: with(adminUserRemove)},
	}
}

// patternList is a repeatable flag of topic patterns. Patterns are not split
// on commas: a topic name may contain one.
type patternList []string

func (p *patternList) String() string { return strings.Join(*p, " ") }
func (p *patternList) Set(s string) error {
	if err := auth.ValidatePattern(s); err != nil {
		return err
	}
	*p = append(*p, s)
	return nil
}

// userFlags are the flags of every user command.
type userFlags struct {
	adminFlags
	dataDir *string
	perms   struct{ publish, consume, manage patternList }
	stdin   *bool
}

func addUserFlags(fs *flag.FlagSet, withPerms, withPassword bool) *userFlags {
	f := &userFlags{adminFlags: addAdminFlags(fs)}
	f.dataDir = fs.String("data-dir", "", "change the users store of the stopped broker at this data dir instead of asking a running broker's admin API (takes the data dir's lock)")
	if withPerms {
		fs.Var(&f.perms.publish, "publish", "topic `pattern` the user may publish to: a topic, or a prefix ending in * (repeat for more)")
		fs.Var(&f.perms.consume, "consume", "topic `pattern` the user may subscribe to (repeat for more)")
		fs.Var(&f.perms.manage, "manage", "topic `pattern` the user may declare, purge and delete; --manage '*' makes an administrator (repeat for more)")
	}
	if withPassword {
		f.stdin = fs.Bool("password-stdin", false, "read the new password from the first line of standard input (otherwise from the environment variable "+newPasswordEnv+")")
	}
	return f
}

func (f *userFlags) permissions() auth.Permissions {
	return auth.Permissions{Publish: f.perms.publish, Consume: f.perms.consume, Manage: f.perms.manage}
}

// newPassword reads the password a command sets, from stdin or the
// environment, never from argv.
func (f *userFlags) newPassword(stdin io.Reader) (string, error) {
	if *f.stdin {
		if stdin == nil {
			return "", fmt.Errorf("%w: --password-stdin: no standard input", errUsage)
		}
		// Read one bounded line: the password, without its line end.
		line, err := bufio.NewReaderSize(io.LimitReader(stdin, auth.PasswordBytesMax+2), auth.PasswordBytesMax+2).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return "", fmt.Errorf("--password-stdin: %w", err)
		}
		pw := strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		if pw == "" {
			return "", fmt.Errorf("%w: --password-stdin: standard input has no password on its first line", errUsage)
		}
		return pw, nil
	}
	pw := os.Getenv(newPasswordEnv)
	if pw == "" {
		return "", fmt.Errorf("%w: give the new password on standard input with --password-stdin, or in the environment variable %s (never as an argument)", errUsage, newPasswordEnv)
	}
	return pw, nil
}

// userStore is what the user commands change: the admin API of a running
// broker, or the users store of a stopped one.
type userStore interface {
	list(ctx context.Context) ([]apiUser, json.RawMessage, error)
	add(ctx context.Context, name, password string, p auth.Permissions) (apiUser, json.RawMessage, error)
	setPassword(ctx context.Context, name, password string) (apiUser, json.RawMessage, error)
	patchPermissions(ctx context.Context, name string, grant, revoke auth.Permissions) (apiUser, json.RawMessage, error)
	remove(ctx context.Context, name string) (json.RawMessage, error)
	where() string
	close()
}

// openUserStore parses the flags with exactly one positional (the user
// name) when named, and opens the store the flags name.
func openUserStore(fs *flag.FlagSet, f *userFlags, args []string, named bool) (string, userStore, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return "", nil, err
	}
	name := ""
	switch {
	case named && len(pos) != 1:
		return "", nil, fmt.Errorf("%w: give exactly one user name", errUsage)
	case !named && len(pos) > 0:
		return "", nil, fmt.Errorf("%w: unexpected argument %q", errUsage, pos[0])
	case named:
		name = pos[0]
	}
	if *f.dataDir != "" {
		s, err := openLocalUsers(*f.dataDir)
		return name, s, err
	}
	c, err := f.client()
	if err != nil {
		return "", nil, err
	}
	return name, &apiUsers{c: c}, nil
}

// apiUsers is the admin API of a running broker.
type apiUsers struct{ c *adminClient }

func userPath(name string, rest ...string) string {
	p := "/api/v1/users/" + url.PathEscape(name)
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

func (s *apiUsers) one(ctx context.Context, method, path string, body any) (apiUser, json.RawMessage, error) {
	var raw json.RawMessage
	if _, err := s.c.do(ctx, method, path, nil, body, &raw); err != nil {
		return apiUser{}, nil, err
	}
	var u apiUser
	if err := json.Unmarshal(raw, &u); err != nil {
		return apiUser{}, nil, fmt.Errorf("admin API at %s: the answer to %s %s is not the JSON expected: %v", s.c.addr, method, path, err)
	}
	return u, raw, nil
}

func (s *apiUsers) list(ctx context.Context) ([]apiUser, json.RawMessage, error) {
	var raw json.RawMessage
	if _, err := s.c.do(ctx, http.MethodGet, "/api/v1/users", nil, nil, &raw); err != nil {
		return nil, nil, err
	}
	var us apiUsersList
	if err := json.Unmarshal(raw, &us); err != nil {
		return nil, nil, fmt.Errorf("admin API at %s: the answer to GET /api/v1/users is not the JSON expected: %v", s.c.addr, err)
	}
	return us.Users, raw, nil
}

func (s *apiUsers) add(ctx context.Context, name, password string, p auth.Permissions) (apiUser, json.RawMessage, error) {
	return s.one(ctx, http.MethodPost, "/api/v1/users", apiUserAdd{Name: name, Password: password, Permissions: apiPermissionsOf(p)})
}

func (s *apiUsers) setPassword(ctx context.Context, name, password string) (apiUser, json.RawMessage, error) {
	return s.one(ctx, http.MethodPut, userPath(name, "password"), apiUserPassword{Password: password})
}

func (s *apiUsers) patchPermissions(ctx context.Context, name string, grant, revoke auth.Permissions) (apiUser, json.RawMessage, error) {
	return s.one(ctx, http.MethodPatch, userPath(name, "permissions"), apiPermissionsPatch{Grant: apiPermissionsOf(grant), Revoke: apiPermissionsOf(revoke)})
}

func (s *apiUsers) remove(ctx context.Context, name string) (json.RawMessage, error) {
	var raw json.RawMessage
	_, err := s.c.do(ctx, http.MethodDelete, userPath(name), nil, nil, &raw)
	return raw, err
}

func (s *apiUsers) where() string { return "the broker at " + s.c.addr }
func (s *apiUsers) close()        {}

// localUsers is the users store of a stopped broker, under its data dir's
// lock.
type localUsers struct {
	dir  string
	lock *broker.DataDirLock
	u    *auth.Users
}

func openLocalUsers(dir string) (*localUsers, error) {
	lock, err := broker.LockDataDir(nil, dir)
	if err != nil {
		var le *broker.DataDirLockedError
		if errors.As(err, &le) {
			return nil, fmt.Errorf("%v: a running broker owns its users; drop --data-dir to change them through its admin API", err)
		}
		return nil, err
	}
	u, err := auth.OpenUsers(vfs.OS(), broker.UsersPath(dir))
	if err != nil {
		lock.Release()
		return nil, err
	}
	return &localUsers{dir: dir, lock: lock, u: u}, nil
}

func (s *localUsers) view(name string) (apiUser, json.RawMessage, error) {
	for _, info := range s.u.List() {
		if info.Name == name {
			v := apiUser{Name: name, Permissions: apiPermissionsOf(info.Perms)}
			raw, err := json.Marshal(v)
			return v, raw, err
		}
	}
	return apiUser{}, nil, fmt.Errorf("%w: %q", auth.ErrUserNotFound, name)
}

func (s *localUsers) list(context.Context) ([]apiUser, json.RawMessage, error) {
	out := apiUsersList{Users: []apiUser{}}
	for _, info := range s.u.List() {
		out.Users = append(out.Users, apiUser{Name: info.Name, Permissions: apiPermissionsOf(info.Perms)})
	}
	raw, err := json.Marshal(out)
	return out.Users, raw, err
}

func (s *localUsers) add(_ context.Context, name, password string, p auth.Permissions) (apiUser, json.RawMessage, error) {
	if err := s.u.Add(name, password, p); err != nil {
		return apiUser{}, nil, err
	}
	return s.view(name)
}

func (s *localUsers) setPassword(_ context.Context, name, password string) (apiUser, json.RawMessage, error) {
	if err := s.u.SetPassword(name, password); err != nil {
		return apiUser{}, nil, err
	}
	return s.view(name)
}

// patchPermissions reads, changes and writes under the data dir's lock, so
// nothing else changes the store in between.
func (s *localUsers) patchPermissions(_ context.Context, name string, grant, revoke auth.Permissions) (apiUser, json.RawMessage, error) {
	cur, _, err := s.view(name)
	if err != nil {
		return apiUser{}, nil, err
	}
	if err := s.u.SetPermissions(name, cur.Permissions.perms().Grant(grant).Revoke(revoke)); err != nil {
		return apiUser{}, nil, err
	}
	return s.view(name)
}

func (s *localUsers) remove(_ context.Context, name string) (json.RawMessage, error) {
	if err := s.u.Remove(name); err != nil {
		return nil, err
	}
	return json.RawMessage(`{"removed":true}`), nil
}

func (s *localUsers) where() string { return "data dir " + s.dir }
func (s *localUsers) close()        { s.lock.Release() }

// patternsCell shows a list of patterns in a table cell.
func patternsCell(ps []string) string {
	if len(ps) == 0 {
		return "-"
	}
	cells := make([]string, len(ps))
	for i, p := range ps {
		cells[i] = cellText(p)
	}
	return strings.Join(cells, " ")
}

func printUsers(w io.Writer, users []apiUser) error {
	t := newTable(w, "NAME", "PUBLISH", "CONSUME", "MANAGE")
	for _, u := range users {
		p := u.Permissions
		t.row(u.Name, patternsCell(p.Publish), patternsCell(p.Consume), patternsCell(p.Manage))
	}
	return t.flush()
}

// printUser prints one user after a change: the raw JSON with --json,
// otherwise what happened and the user's permissions now.
func printUser(w io.Writer, f *userFlags, raw json.RawMessage, what string, u apiUser) error {
	if *f.json {
		return printRaw(w, raw)
	}
	p := u.Permissions
	_, err := fmt.Fprintf(w, "%s %s: publish %s; consume %s; manage %s\n", what, u.Name,
		patternsCell(p.Publish), patternsCell(p.Consume), patternsCell(p.Manage))
	return err
}

func adminUserList(ctx context.Context, name string, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addUserFlags(fs, false, false)
	_, s, err := openUserStore(fs, f, args, false)
	if err != nil {
		return err
	}
	defer s.close()
	users, raw, err := s.list(ctx)
	if err != nil {
		return err
	}
	if *f.json {
		return printRaw(stdout, raw)
	}
	return printUsers(stdout, users)
}

func adminUserShow(ctx context.Context, name string, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addUserFlags(fs, false, false)
	user, s, err := openUserStore(fs, f, args, true)
	if err != nil {
		return err
	}
	defer s.close()
	u, raw, err := userOf(ctx, s, user)
	if err != nil {
		return err
	}
	if *f.json {
		return printRaw(stdout, raw)
	}
	return printUsers(stdout, []apiUser{u})
}

// userOf reads one user.
func userOf(ctx context.Context, s userStore, name string) (apiUser, json.RawMessage, error) {
	if a, ok := s.(*apiUsers); ok {
		return a.one(ctx, http.MethodGet, userPath(name), nil)
	}
	return s.(*localUsers).view(name)
}

func adminUserAdd(ctx context.Context, name string, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addUserFlags(fs, true, true)
	user, s, err := openUserStore(fs, f, args, true)
	if err != nil {
		return err
	}
	defer s.close()
	pw, err := f.newPassword(stdin)
	if err != nil {
		return err
	}
	u, raw, err := s.add(ctx, user, pw, f.permissions())
	if err != nil {
		return err
	}
	if err := printUser(stdout, f, raw, "added user to "+s.where()+":", u); err != nil {
		return err
	}
	if a, ok := s.(*apiUsers); ok && a.c.authz == "" {
		noteCredentialsNowNeeded(ctx, a.c, u.Name, f.permissions(), stderr)
	}
	return nil
}

// noteCredentialsNowNeeded tells the user, after an add made without
// credentials, when the admin API has started asking for them: a broker with
// no users serves loopback requests without credentials, and its first user
// ends that, so the next command as typed would get 401. It names the flags
// to use, and warns when the new user cannot use the admin API itself.
func noteCredentialsNowNeeded(ctx context.Context, c *adminClient, user string, p auth.Permissions, stderr io.Writer) {
	var ae *apiError
	if _, err := c.do(ctx, http.MethodGet, "/api/v1/users", nil, nil, nil); !errors.As(err, &ae) || ae.status != http.StatusUnauthorized {
		return
	}
	if slices.Contains(p.Manage, "*") {
		fmt.Fprintf(stderr, "note: the admin API at %s now asks for credentials; run the next admin commands as %s: --user %s (or env SINEW_USER) with the password in env SINEW_PASSWORD or --password-file\n", c.addr, user, user)
		return
	}
	fmt.Fprintf(stderr, "note: the admin API at %s now asks for credentials, and %s may not use it (it needs --manage '*'); add an administrator with --data-dir while the broker is stopped, or configure auth.tokens\n", c.addr, user)
}

func adminUserPasswd(ctx context.Context, name string, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addUserFlags(fs, false, true)
	user, s, err := openUserStore(fs, f, args, true)
	if err != nil {
		return err
	}
	defer s.close()
	pw, err := f.newPassword(stdin)
	if err != nil {
		return err
	}
	u, raw, err := s.setPassword(ctx, user, pw)
	if err != nil {
		return err
	}
	if *f.json {
		return printRaw(stdout, raw)
	}
	_, err = fmt.Fprintf(stdout, "password of %s changed in %s; open connections keep their login\n", u.Name, s.where())
	return err
}

// adminUserChange grants or revokes the patterns the flags give, in one
// step on the broker (PATCH) or under the data dir's lock.
func adminUserChange(ctx context.Context, name string, args []string, stdout, stderr io.Writer, revoke bool) error {
	fs := newFlagSet(name, stderr)
	f := addUserFlags(fs, true, false)
	user, s, err := openUserStore(fs, f, args, true)
	if err != nil {
		return err
	}
	defer s.close()
	given := f.permissions()
	if given.IsZero() {
		return fmt.Errorf("%w: give at least one --publish, --consume or --manage pattern", errUsage)
	}
	var grant, take auth.Permissions
	verb := "granted; now"
	if revoke {
		take, verb = given, "revoked; now"
	} else {
		grant = given
	}
	u, raw, err := s.patchPermissions(ctx, user, grant, take)
	if err != nil {
		return err
	}
	return printUser(stdout, f, raw, verb, u)
}

func adminUserGrant(ctx context.Context, name string, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	return adminUserChange(ctx, name, args, stdout, stderr, false)
}

func adminUserRevoke(ctx context.Context, name string, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	return adminUserChange(ctx, name, args, stdout, stderr, true)
}

func adminUserRemove(ctx context.Context, name string, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addUserFlags(fs, false, false)
	user, s, err := openUserStore(fs, f, args, true)
	if err != nil {
		return err
	}
	defer s.close()
	raw, err := s.remove(ctx, user)
	if err != nil {
		return err
	}
	if *f.json {
		return printRaw(stdout, raw)
	}
	_, err = fmt.Fprintf(stdout, "removed user %s from %s; open connections keep their login until they close\n", user, s.where())
	return err
}
