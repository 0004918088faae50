package admin

import (
	"net/http"
)

// ConnectionsView is the JSON of GET /api/v1/connections.
type ConnectionsView struct {
	Connections []ConnectionView `json:"connections"`
}

// ConnectionView is one open client connection.
type ConnectionView struct {
	ConnID        uint64 `json:"conn_id"`
	RemoteAddr    string `json:"remote_addr"`
	ConnectedAtMs int64  `json:"connected_at_ms"`
	// Established is false until the handshake succeeded.
	Established bool `json:"established"`
	// ClientID is the session attached to the connection; "" before the
	// handshake.
	ClientID      string `json:"client_id"`
	Subscriptions int    `json:"subscriptions"`
}

// SessionsView is the JSON of GET /api/v1/sessions.
type SessionsView struct {
	Sessions []SessionView `json:"sessions"`
}

// SessionView is one session, attached or dormant.
type SessionView struct {
	ClientID string `json:"client_id"`
	// State is attached or dormant.
	State  string `json:"state"`
	ConnID uint64 `json:"conn_id"`
	// GraceLeftMs is the time until a dormant session ends; null while
	// attached.
	GraceLeftMs   *int64             `json:"grace_left_ms"`
	Inflight      int                `json:"inflight"`
	Pending       int                `json:"pending"`
	Subscriptions []SubscriptionView `json:"subscriptions"`
}

// SubscriptionView is one subscription of a session.
type SubscriptionView struct {
	SubID     uint64 `json:"sub_id"`
	Topic     string `json:"topic"`
	Group     string `json:"group"`
	Partition int32  `json:"partition"`
	Prefetch  uint32 `json:"prefetch"`
	AutoAck   bool   `json:"auto_ack"`
	Inflight  int    `json:"inflight"`
}

func (a *api) sessionList() []SessionView {
	out := []SessionView{}
	if a.cfg.Server == nil {
		return out
	}
	for _, s := range a.cfg.Server.Registry().Sessions() {
		v := SessionView{ClientID: s.ClientID, State: "attached", ConnID: s.ConnID, Inflight: s.Inflight, Pending: s.Pending,
			Subscriptions: make([]SubscriptionView, 0, len(s.Subscriptions))}
		if !s.Attached {
			v.State = "dormant"
			left := s.GraceLeft.Milliseconds()
			v.GraceLeftMs = &left
		}
		for _, sub := range s.Subscriptions {
			v.Subscriptions = append(v.Subscriptions, SubscriptionView{SubID: sub.SubID, Topic: sub.Topic, Group: sub.Group,
				Partition: sub.Partition, Prefetch: sub.Prefetch, AutoAck: sub.AutoAck, Inflight: sub.Inflight})
		}
		out = append(out, v)
	}
	return out
}

func (a *api) sessions(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, SessionsView{Sessions: a.sessionList()})
}

func (a *api) connections(w http.ResponseWriter, _ *http.Request) {
	out := ConnectionsView{Connections: []ConnectionView{}}
	if a.cfg.Server == nil {
		writeJSON(w, http.StatusOK, out)
		return
	}
	byConn := map[uint64]SessionView{}
	for _, s := range a.sessionList() {
		if s.State == "attached" {
			byConn[s.ConnID] = s
		}
	}
	for _, c := range a.cfg.Server.Connections() {
		v := ConnectionView{ConnID: c.ConnID, RemoteAddr: c.RemoteAddr, ConnectedAtMs: c.OpenedAt.UnixMilli(), Established: c.Established}
		if s, ok := byConn[c.ConnID]; ok {
			v.ClientID, v.Subscriptions = s.ClientID, len(s.Subscriptions)
		}
		out.Connections = append(out.Connections, v)
	}
	writeJSON(w, http.StatusOK, out)
}
