package admin

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/sinewmq/sinew/internal/auth"
)

// User administration: /api/v1/users. Passwords travel only in request
// bodies (never in a path or query, which proxies and access logs keep), are
// never echoed in an answer or an error, and reach nothing but the users
// store, which keeps only their hash. Every change is durable when the
// answer is sent.

// PermissionsView is the JSON of a user's permissions: a list of topic
// patterns per action, each list present (empty when none).
type PermissionsView struct {
	Publish []string `json:"publish"`
	Consume []string `json:"consume"`
	Manage  []string `json:"manage"`
}

func permissionsView(p auth.Permissions) PermissionsView {
	orEmpty := func(s []string) []string {
		if s == nil {
			return []string{}
		}
		return s
	}
	return PermissionsView{Publish: orEmpty(p.Publish), Consume: orEmpty(p.Consume), Manage: orEmpty(p.Manage)}
}

func (v PermissionsView) perms() auth.Permissions {
	return auth.Permissions{Publish: v.Publish, Consume: v.Consume, Manage: v.Manage}
}

// checkPerms refuses what the store would refuse, as a 400 naming the
// problem, before any password is hashed.
func checkPerms(p auth.Permissions) error {
	if n := len(p.Publish) + len(p.Consume) + len(p.Manage); n > auth.PatternsMax {
		return fmt.Errorf("%w: %d topic patterns, at most %d", auth.ErrInvalidPattern, n, auth.PatternsMax)
	}
	return p.Validate()
}

// UserView is the JSON of one user: never the password or its hash.
type UserView struct {
	Name        string          `json:"name"`
	Permissions PermissionsView `json:"permissions"`
}

// UsersView is the JSON of GET /api/v1/users.
type UsersView struct {
	Users []UserView `json:"users"`
}

// UserAdd is the body of POST /api/v1/users. Permissions may be left out:
// the user then may do nothing that names a topic until granted.
type UserAdd struct {
	Name        string          `json:"name"`
	Password    string          `json:"password"`
	Permissions PermissionsView `json:"permissions"`
}

// UserPassword is the body of PUT /api/v1/users/{name}/password.
type UserPassword struct {
	Password string `json:"password"`
}

// PermissionsPatch is the body of PATCH /api/v1/users/{name}/permissions:
// patterns to add (those already held are not repeated), then patterns to
// remove as written (removing "orders.eu" leaves "orders.*").
type PermissionsPatch struct {
	Grant  PermissionsView `json:"grant"`
	Revoke PermissionsView `json:"revoke"`
}

// UserRemoved is the JSON of DELETE /api/v1/users/{name}.
type UserRemoved struct {
	Removed bool `json:"removed"`
}

func (a *api) users(w http.ResponseWriter) (*auth.Users, bool) {
	u := a.cfg.Broker.Users()
	if u == nil {
		writeError(w, http.StatusServiceUnavailable, "unavailable", "this broker has no users store")
		return nil, false
	}
	return u, true
}

// findUser returns name's entry in the store.
func findUser(u *auth.Users, name string) (UserView, bool) {
	for _, info := range u.List() {
		if info.Name == name {
			return UserView{Name: info.Name, Permissions: permissionsView(info.Perms)}, true
		}
	}
	return UserView{}, false
}

func (a *api) listUsers(w http.ResponseWriter, _ *http.Request) {
	u, ok := a.users(w)
	if !ok {
		return
	}
	infos := u.List()
	out := UsersView{Users: make([]UserView, 0, len(infos))}
	for _, info := range infos {
		out.Users = append(out.Users, UserView{Name: info.Name, Permissions: permissionsView(info.Perms)})
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) getUser(w http.ResponseWriter, r *http.Request) {
	u, ok := a.users(w)
	if !ok {
		return
	}
	name := r.PathValue("name")
	v, ok := findUser(u, name)
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no user %q", name))
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (a *api) addUser(w http.ResponseWriter, r *http.Request) {
	u, ok := a.users(w)
	if !ok {
		return
	}
	var body UserAdd
	if !decodeBody(w, r, &body, false) {
		return
	}
	perms := body.Permissions.perms()
	if err := checkPerms(perms); err != nil {
		writeUsersError(w, err)
		return
	}
	if a.cfg.UserAddCheck != nil {
		if err := a.cfg.UserAddCheck(); err != nil {
			writeError(w, http.StatusConflict, "conflict", err.Error())
			return
		}
	}
	if err := u.Add(body.Name, body.Password, perms); err != nil {
		writeUsersError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, UserView{Name: body.Name, Permissions: permissionsView(perms)})
}

func (a *api) setPassword(w http.ResponseWriter, r *http.Request) {
	u, ok := a.users(w)
	if !ok {
		return
	}
	var body UserPassword
	if !decodeBody(w, r, &body, false) {
		return
	}
	name := r.PathValue("name")
	if err := u.SetPassword(name, body.Password); err != nil {
		writeUsersError(w, err)
		return
	}
	a.writeUser(w, u, name)
}

func (a *api) setPermissions(w http.ResponseWriter, r *http.Request) {
	u, ok := a.users(w)
	if !ok {
		return
	}
	var body PermissionsView
	if !decodeBody(w, r, &body, false) {
		return
	}
	name := r.PathValue("name")
	if err := checkPerms(body.perms()); err != nil {
		writeUsersError(w, err)
		return
	}
	if err := u.SetPermissions(name, body.perms()); err != nil {
		writeUsersError(w, err)
		return
	}
	a.writeUser(w, u, name)
}

// patchPermissions grants and revokes patterns in one step. The read and
// the write happen under permsMu, so two PATCHes never lose each other's
// change. (A PUT replaces the whole set and does not take the lock: it does
// not depend on what was there.)
func (a *api) patchPermissions(w http.ResponseWriter, r *http.Request) {
	u, ok := a.users(w)
	if !ok {
		return
	}
	var body PermissionsPatch
	if !decodeBody(w, r, &body, false) {
		return
	}
	grant, revoke := body.Grant.perms(), body.Revoke.perms()
	if grant.IsZero() && revoke.IsZero() {
		writeError(w, http.StatusBadRequest, "bad_request", "nothing to grant or revoke")
		return
	}
	for _, p := range []auth.Permissions{grant, revoke} {
		if err := checkPerms(p); err != nil {
			writeUsersError(w, err)
			return
		}
	}
	name := r.PathValue("name")
	a.permsMu.Lock()
	cur, ok := findUser(u, name)
	if !ok {
		a.permsMu.Unlock()
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no user %q", name))
		return
	}
	next := cur.Permissions.perms().Grant(grant).Revoke(revoke)
	err := checkPerms(next)
	if err == nil {
		err = u.SetPermissions(name, next)
	}
	a.permsMu.Unlock()
	if err != nil {
		writeUsersError(w, err)
		return
	}
	a.writeUser(w, u, name)
}

func (a *api) removeUser(w http.ResponseWriter, r *http.Request) {
	u, ok := a.users(w)
	if !ok {
		return
	}
	if err := u.Remove(r.PathValue("name")); err != nil {
		writeUsersError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, UserRemoved{Removed: true})
}

// writeUser answers with name's current entry; a concurrent remove between
// the change and this read answers 404, which is what the store now holds.
func (a *api) writeUser(w http.ResponseWriter, u *auth.Users, name string) {
	v, ok := findUser(u, name)
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no user %q", name))
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// writeUsersError maps a users-store error to the API's error shape. The
// store's messages never hold a password (only its length).
func writeUsersError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, auth.ErrUserNotFound):
		writeError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, auth.ErrUserExists):
		writeError(w, http.StatusConflict, "conflict", err.Error())
	case errors.Is(err, auth.ErrTooManyUsers):
		writeError(w, http.StatusBadRequest, "limit_exceeded", err.Error())
	case errors.Is(err, auth.ErrInvalidName), errors.Is(err, auth.ErrInvalidPassword), errors.Is(err, auth.ErrInvalidPattern):
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
	default:
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
	}
}
