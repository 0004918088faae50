package admin

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/partition"
	"github.com/sinewmq/sinew/protocol"
)

// Bounds of message inspection.
const (
	peekLimitDefault       = 20
	peekLimitMax           = 100
	previewBytesDefault    = 1024
	previewBytesMax        = 64 << 10
	deadLetterLimitDefault = 50
	deadLetterLimitMax     = 200
	replayItemsMax         = 100
	// deadLetterPeeksMax bounds the partition walks of one dead-letter
	// listing (each walks at most partition.PeekScanMax offsets); a listing
	// that reaches it returns a cursor even if it found fewer than limit.
	deadLetterPeeksMax = 64
)

// MessagesView is the JSON of GET /api/v1/queues/{topic}/messages.
type MessagesView struct {
	Topic     string `json:"topic"`
	Group     string `json:"group"`
	Partition uint32 `json:"partition"`
	From      uint64 `json:"from"`
	// Next is the offset to continue from (from=Next); it equals
	// NextOffset once the end of the log was reached.
	Next       uint64        `json:"next"`
	NextOffset uint64        `json:"next_offset"`
	Messages   []MessageView `json:"messages"`
}

// MessageView is one message as inspection shows it. Binary data is never
// mangled: the key and body preview are always given in base64, and also as
// text when they are valid UTF-8; a header value that is not valid UTF-8 is
// given in base64 only.
type MessageView struct {
	Offset        uint64       `json:"offset"`
	State         string       `json:"state"`
	Attempt       uint32       `json:"attempt"`
	PublishedAtMs int64        `json:"published_at_ms"`
	ContentType   string       `json:"content_type"`
	KeyB64        string       `json:"key_b64,omitempty"`
	KeyText       *string      `json:"key_text,omitempty"`
	Headers       []HeaderView `json:"headers"`
	BodyBytes     int          `json:"body_bytes"`
	BodyB64       string       `json:"body_b64"`
	BodyText      *string      `json:"body_text,omitempty"`
	BodyTruncated bool         `json:"body_truncated"`
	// Error is set when the message's body could not be read from the log.
	Error string `json:"error,omitempty"`
}

// HeaderView is one header; exactly one of Value and ValueB64 is set.
type HeaderView struct {
	Key      string  `json:"key"`
	Value    *string `json:"value,omitempty"`
	ValueB64 string  `json:"value_b64,omitempty"`
}

func textOf(b []byte) *string {
	if !utf8.Valid(b) {
		return nil
	}
	s := string(b)
	return &s
}

func messageView(pk *partition.Peeked, previewBytes int) MessageView {
	v := MessageView{Offset: pk.Info.Offset, State: pk.Info.State.String(), Attempt: pk.Info.Attempt, Headers: []HeaderView{}}
	if pk.Err != nil || pk.Msg == nil {
		v.Error = fmt.Sprint(pk.Err)
		return v
	}
	m := pk.Msg
	v.PublishedAtMs, v.ContentType = m.PublishedAtMs, m.ContentType
	if len(m.Key) > 0 {
		v.KeyB64 = base64.StdEncoding.EncodeToString(m.Key)
		v.KeyText = textOf(m.Key)
	}
	for _, h := range m.Headers {
		hv := HeaderView{Key: h.Key}
		if utf8.ValidString(h.Value) {
			val := h.Value
			hv.Value = &val
		} else {
			hv.ValueB64 = base64.StdEncoding.EncodeToString([]byte(h.Value))
		}
		v.Headers = append(v.Headers, hv)
	}
	v.BodyBytes = len(m.Body)
	preview := m.Body
	if len(preview) > previewBytes {
		preview = preview[:previewBytes]
		v.BodyTruncated = true
		// Cut at a rune boundary so that a text body stays text.
		for i := 0; i < utf8.UTFMax && len(preview) > 0 && !utf8.Valid(preview) && utf8.Valid(m.Body); i++ {
			preview = preview[:len(preview)-1]
		}
	}
	v.BodyB64 = base64.StdEncoding.EncodeToString(preview)
	v.BodyText = textOf(preview)
	return v
}

// intParam reads an optional integer query parameter within [lo, hi].
func intParam(r *http.Request, name string, def, lo, hi uint64) (uint64, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v < lo || v > hi {
		return 0, fmt.Errorf("%s=%q: want an integer in [%d, %d]", name, s, lo, hi)
	}
	return v, nil
}

func (a *api) messages(w http.ResponseWriter, r *http.Request) {
	topic, group := queueName(r)
	if r.URL.Query().Get("partition") == "" {
		writeError(w, http.StatusBadRequest, "bad_request", "partition is required (0-based)")
		return
	}
	part, err := intParam(r, "partition", 0, 0, 1<<32-1)
	from, err2 := intParam(r, "from", 0, 0, 1<<63-1)
	// to (exclusive) ends the offset range; absent: no end.
	to, err5 := intParam(r, "to", 1<<63-1, 0, 1<<63-1)
	limit, err3 := intParam(r, "limit", peekLimitDefault, 1, peekLimitMax)
	preview, err4 := intParam(r, "preview_bytes", previewBytesDefault, 0, previewBytesMax)
	for _, e := range []error{err, err2, err3, err4, err5} {
		if e != nil {
			writeError(w, http.StatusBadRequest, "bad_request", e.Error())
			return
		}
	}
	if to < from {
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("to=%d is below from=%d", to, from))
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	res, err := a.cfg.Broker.Peek(ctx, topic, group, uint32(part), from, int(limit))
	if err != nil {
		writeBrokerError(w, err)
		return
	}
	out := MessagesView{Topic: topic, Group: group, Partition: uint32(part), From: from, Next: min(res.Next, to), NextOffset: res.NextLSN,
		Messages: make([]MessageView, 0, len(res.Messages))}
	for i := range res.Messages {
		if res.Messages[i].Info.Offset >= to {
			break
		}
		out.Messages = append(out.Messages, messageView(&res.Messages[i], int(preview)))
	}
	writeJSON(w, http.StatusOK, out)
}

// DeadLettersView is the JSON of GET /api/v1/deadletters.
type DeadLettersView struct {
	Topic       string           `json:"topic"`
	DeadLetters []DeadLetterView `json:"dead_letters"`
	// NextCursor continues the listing; "" when there is nothing more.
	NextCursor string `json:"next_cursor"`
}

// DeadLetterView is one message of a dead-letter queue, with where it came
// from and why.
type DeadLetterView struct {
	Partition        uint32      `json:"partition"`
	Offset           uint64      `json:"offset"`
	Reason           string      `json:"reason"`
	SourceTopic      string      `json:"source_topic"`
	SourceGroup      string      `json:"source_group"`
	SourcePartition  uint32      `json:"source_partition"`
	SourceOffset     uint64      `json:"source_offset"`
	Retries          uint32      `json:"retries"`
	DeadLetteredAtMs int64       `json:"dead_lettered_at_ms"`
	Message          MessageView `json:"message"`
}

// parseCursor reads "partition:offset"; "" is the start.
func parseCursor(s string) (uint32, uint64, error) {
	if s == "" {
		return 0, 0, nil
	}
	ps, os, ok := strings.Cut(s, ":")
	p, err := strconv.ParseUint(ps, 10, 32)
	o, err2 := strconv.ParseUint(os, 10, 64)
	if !ok || err != nil || err2 != nil {
		return 0, 0, fmt.Errorf("cursor %q is not one this API returned", s)
	}
	return uint32(p), o, nil
}

func (a *api) deadLetters(w http.ResponseWriter, r *http.Request) {
	b := a.cfg.Broker
	q := r.URL.Query()
	topic := q.Get("topic")
	if topic == "" {
		topic = b.DeadLetterTopic()
	}
	limit, err := intParam(r, "limit", deadLetterLimitDefault, 1, deadLetterLimitMax)
	preview, err2 := intParam(r, "preview_bytes", previewBytesDefault, 0, previewBytesMax)
	part, off, err3 := parseCursor(q.Get("cursor"))
	for _, e := range []error{err, err2, err3} {
		if e != nil {
			writeError(w, http.StatusBadRequest, "bad_request", e.Error())
			return
		}
	}
	out := DeadLettersView{Topic: topic, DeadLetters: []DeadLetterView{}}
	qs, err := b.QueueStatsOf(topic, "")
	if err != nil {
		if protocol.CodeOf(err) == protocol.CodeNotFound && topic == b.DeadLetterTopic() {
			writeJSON(w, http.StatusOK, out) // nothing was dead-lettered yet
			return
		}
		writeBrokerError(w, err)
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	n := uint32(len(qs.Partitions))
	peeks := 0
walk:
	for ; part < n; part, off = part+1, 0 {
		for len(out.DeadLetters) < int(limit) {
			if peeks == deadLetterPeeksMax {
				break walk // the cursor says where to go on
			}
			peeks++
			res, err := b.Peek(ctx, topic, "", part, off, int(limit)-len(out.DeadLetters))
			if err != nil {
				writeBrokerError(w, err)
				return
			}
			for i := range res.Messages {
				out.DeadLetters = append(out.DeadLetters, deadLetterView(part, &res.Messages[i], int(preview)))
			}
			off = res.Next
			if off >= res.NextLSN {
				break
			}
		}
		if len(out.DeadLetters) >= int(limit) {
			break
		}
	}
	if part < n {
		out.NextCursor = fmt.Sprintf("%d:%d", part, off)
	}
	writeJSON(w, http.StatusOK, out)
}

func deadLetterView(part uint32, pk *partition.Peeked, preview int) DeadLetterView {
	v := DeadLetterView{Partition: part, Offset: pk.Info.Offset, Message: messageView(pk, preview)}
	if pk.Msg != nil {
		src := broker.DeadLetterSourceOf(pk.Msg.Headers)
		v.Reason, v.SourceTopic, v.SourceGroup, v.SourcePartition, v.SourceOffset = src.Reason, src.Topic, src.Group, src.Partition, src.Offset
		v.Retries, v.DeadLetteredAtMs = src.Retries, src.DeadLetteredAtMs
	}
	return v
}

// ReplayRequest is the body of POST /api/v1/deadletters/replay.
type ReplayRequest struct {
	// Topic is the dead-letter queue's topic; "" is the broker's.
	Topic string       `json:"topic"`
	Items []ReplayItem `json:"items"`
	// Keep leaves the dead-letter copy in place; by default it is removed
	// once the replayed message is confirmed on its source queue.
	Keep bool `json:"keep"`
}

// ReplayItem names one message of the dead-letter queue.
type ReplayItem struct {
	Partition uint32 `json:"partition"`
	Offset    uint64 `json:"offset"`
}

// ReplayView is the JSON answer of a replay: one result per item.
type ReplayView struct {
	Results []ReplayResult `json:"results"`
}

// ReplayResult is the outcome of one item.
type ReplayResult struct {
	Partition uint32 `json:"partition"`
	Offset    uint64 `json:"offset"`
	// Status is replayed, not_found (no such unsettled message, or not a
	// dead-letter copy) or error.
	Status          string `json:"status"`
	Error           string `json:"error"`
	TargetTopic     string `json:"target_topic"`
	TargetGroup     string `json:"target_group"`
	TargetPartition uint32 `json:"target_partition"`
	TargetOffset    uint64 `json:"target_offset"`
	// Removed says the dead-letter copy was removed.
	Removed bool `json:"removed"`
}

func (a *api) replay(w http.ResponseWriter, r *http.Request) {
	var req ReplayRequest
	if !decodeBody(w, r, &req, false) {
		return
	}
	if len(req.Items) == 0 || len(req.Items) > replayItemsMax {
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("items: want 1 to %d, got %d", replayItemsMax, len(req.Items)))
		return
	}
	if req.Topic == "" {
		req.Topic = a.cfg.Broker.DeadLetterTopic()
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	out := ReplayView{Results: make([]ReplayResult, 0, len(req.Items))}
	for _, it := range req.Items {
		out.Results = append(out.Results, a.replayOne(ctx, req.Topic, it, req.Keep))
	}
	writeJSON(w, http.StatusOK, out)
}
