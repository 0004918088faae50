package protocol

import "fmt"

// Op is a frame's operation code. Ranges are reserved by area so that later
// additions (cluster topology and redirects) do not collide:
//
//	0x01-0x0F  connection: handshake, heartbeat, generic replies
//	0x10-0x1F  queues and publishing
//	0x20-0x2F  subscriptions and delivery
//	0x30-0x3F  settlement
//	0x40-0x4F  session lifecycle: drain notice, reconciliation
//	0x50-0x5F  reserved for cluster frames (topology, redirect)
type Op uint8

// Op codes of protocol version 1.
const (
	OpHello           Op = 0x01 // client -> server, first frame
	OpHelloOK         Op = 0x02 // server -> client
	OpPing            Op = 0x03 // either direction
	OpPong            Op = 0x04 // either direction, echoes the ping's request id
	OpError           Op = 0x05 // server -> client, answers a request or reports a fatal condition
	OpOK              Op = 0x06 // server -> client, answers a request that has no result
	OpDeclareQueue    Op = 0x10 // client -> server
	OpDeclareOK       Op = 0x11 // server -> client
	OpPublish         Op = 0x12 // client -> server
	OpPublishOK       Op = 0x13 // server -> client
	OpDeleteQueue     Op = 0x14 // client -> server, answered by OK
	OpPurgeQueue      Op = 0x15 // client -> server
	OpPurgeOK         Op = 0x16 // server -> client
	OpSubscribe       Op = 0x20 // client -> server
	OpSubscribeOK     Op = 0x21 // server -> client
	OpUnsubscribe     Op = 0x22 // client -> server, answered by OK
	OpSubClosed       Op = 0x23 // server -> client push
	OpDeliver         Op = 0x24 // server -> client push
	OpAssignment      Op = 0x25 // server -> client push: a cohort subscription was assigned or revoked a partition
	OpAck             Op = 0x30 // client -> server
	OpNack            Op = 0x31 // client -> server
	OpFail            Op = 0x32 // client -> server
	OpSettleResult    Op = 0x33 // server -> client
	OpExtend          Op = 0x34 // client -> server, answered by SETTLE_RESULT
	OpGoingAway       Op = 0x40 // server -> client push
	OpReconcile       Op = 0x41 // client -> server
	OpReconcileResult Op = 0x42 // server -> client
	OpEndSession      Op = 0x43 // client -> server, answered by OK, then the server closes
	OpInflight        Op = 0x44 // client -> server, after RECONCILE on a resumed session
	OpInflightResult  Op = 0x45 // server -> client
	OpMetadata        Op = 0x50 // client -> server
	OpMetadataResult  Op = 0x51 // server -> client
)

var opNames = map[Op]string{
	OpHello: "HELLO", OpHelloOK: "HELLO_OK", OpPing: "PING", OpPong: "PONG", OpError: "ERROR", OpOK: "OK",
	OpDeclareQueue: "DECLARE_QUEUE", OpDeclareOK: "DECLARE_OK", OpPublish: "PUBLISH", OpPublishOK: "PUBLISH_OK",
	OpSubscribe: "SUBSCRIBE", OpSubscribeOK: "SUBSCRIBE_OK", OpUnsubscribe: "UNSUBSCRIBE", OpSubClosed: "SUB_CLOSED",
	OpDeliver: "DELIVER", OpAck: "ACK", OpNack: "NACK", OpFail: "FAIL", OpSettleResult: "SETTLE_RESULT",
	OpExtend:    "EXTEND",
	OpGoingAway: "GOING_AWAY", OpReconcile: "RECONCILE", OpReconcileResult: "RECONCILE_RESULT",
	OpDeleteQueue: "DELETE_QUEUE", OpPurgeQueue: "PURGE_QUEUE", OpPurgeOK: "PURGE_OK",
	OpEndSession: "END_SESSION", OpInflight: "INFLIGHT", OpInflightResult: "INFLIGHT_RESULT",
	OpMetadata: "METADATA", OpMetadataResult: "METADATA_RESULT", OpAssignment: "ASSIGNMENT",
}

func (o Op) String() string {
	if n, ok := opNames[o]; ok {
		return n
	}
	return fmt.Sprintf("OP_0x%02x", uint8(o))
}

// Header is one message header, a key/value pair of UTF-8 strings. Keys starting
// with "sinew." are reserved for the broker.
type Header struct{ Key, Value string }

// ResumeOutcome says how the server treated the resume identity offered in HELLO.
type ResumeOutcome uint8

// Resume outcomes.
const (
	ResumeNew      ResumeOutcome = 0 // no identity offered: a fresh session
	ResumeResumed  ResumeOutcome = 1 // the dormant session was reattached
	ResumeNotFound ResumeOutcome = 2 // unknown or expired identity: a fresh session was created
	ResumeRejected ResumeOutcome = 3 // wrong token or another owner's identity: a fresh session was created
)

func (r ResumeOutcome) String() string {
	switch r {
	case ResumeNew:
		return "new"
	case ResumeResumed:
		return "resumed"
	case ResumeNotFound:
		return "resume_not_found"
	case ResumeRejected:
		return "resume_rejected"
	}
	return fmt.Sprintf("resume_outcome_%d", uint8(r))
}

// ResumeIdentity is what a client keeps from HELLO_OK and offers on reconnect.
type ResumeIdentity struct {
	ClientID string
	OwnerID  string
	Token    []byte
}

// Hello opens a session. It must be the first frame on a connection.
type Hello struct {
	ProtocolVersion uint16
	ClientName      string
	ClientVersion   string
	// Credentials is the password when User is set, otherwise a static
	// token; empty to connect anonymously where the broker allows that.
	Credentials string
	Resume      ResumeIdentity // zero when connecting fresh
	// User is the user name to authenticate as; empty for a token or
	// anonymous. Appended to the body after it first shipped: an older
	// client's HELLO decodes with User empty.
	User string
}

// Limits are the bounds the server enforces, announced in HELLO_OK.
type Limits struct {
	FrameBytesMax      uint32 // largest frame either side may send
	BodyBytesMax       uint32 // largest message body
	PrefetchMax        uint32 // largest prefetch per subscription
	SettleBatchMax     uint32 // most tags in one ACK/NACK/FAIL
	PublishInflightMax uint32 // most unconfirmed publishes per connection before the server stops reading
	SubscriptionsMax   uint32 // most subscriptions per session
}

// HelloOK accepts a session.
type HelloOK struct {
	ProtocolVersion  uint16
	ServerVersion    string
	Resume           ResumeIdentity // the identity to present on the next reconnect
	Outcome          ResumeOutcome
	ServerGeneration uint64 // changes on every broker process start
	HeartbeatMs      uint32 // send something at least this often; silence for 3x this closes the connection
	ReconnectGraceMs uint32 // how long a dropped session stays resumable; 0 = not at all
	Limits           Limits
	// Cluster (appended field) is set when the node runs in a cluster:
	// a client dialled with one address asks it METADATA to learn the
	// others. A server that does not send it runs alone.
	Cluster bool
}

// Ping asks the peer to answer with Pong. The request id is echoed.
type Ping struct{}

// Pong answers Ping.
type Pong struct{}

// ErrorBody reports a failed request (request id set) or a connection-level error
// (request id 0), after which the server closes the connection if Fatal is set.
type ErrorBody struct {
	Code    Code
	Message string
	Fatal   bool
	// Owner (appended field) is the owner's client address of a
	// not_owner error; empty otherwise.
	Owner string
}

// OK answers a request that has no other result.
type OK struct{}

// Dead-letter modes for DeclareQueue.
const (
	DeadLetterDefault uint8 = 0 // the broker's configured default (global target)
	DeadLetterDiscard uint8 = 1 // drop dead messages
	DeadLetterGlobal  uint8 = 2 // the broker-wide dead-letter queue
	DeadLetterQueue   uint8 = 3 // the named queue in DeadLetterTarget
)

// DeclareQueue creates a queue or checks an existing one. Zero numeric fields mean
// "the broker default". Re-declaring with different values is a conflict, except for
// the settings that can change on a live queue (max retries, TTL, lease, dead letter).
type DeclareQueue struct {
	Topic            string
	Group            string
	Partitions       uint32
	DeadLetterMode   uint8
	DeadLetterTarget string // topic of the dead-letter queue when mode is DeadLetterQueue
	MaxRetries       int32  // -1 = default
	DefaultTTLMs     int64  // 0 = none
	LeaseMs          int64  // 0 = default (30 s)
}

// DeclareOK answers DeclareQueue.
type DeclareOK struct {
	Partitions uint32
	Created    bool
}

// Publish sends one message. Partition < 0 means "choose": by hash of Key when Key is
// set, round-robin otherwise. With FlagNoReply the broker sends no PUBLISH_OK.
type Publish struct {
	Topic       string
	Group       string
	Partition   int32
	Key         []byte
	Headers     []Header
	ContentType string
	DelayMs     int64 // relative delay; ignored when NotBeforeMs is set
	NotBeforeMs int64 // absolute Unix ms before which the message is not delivered
	TTLMs       int64 // 0 = queue default
	ProducerID  string
	ProducerSeq uint64
	Body        []byte
	// ProducerPrev, when not 0, is the sequence of the same producer's
	// publish this one must be stored after, in the same partition: the
	// partition stores this one only once it holds (producer_id,
	// producer_prev), and answers out_of_sequence otherwise. Appended
	// after body; 0 (or absent) asks for no order.
	ProducerPrev uint64
}

// PublishOK confirms that a message is durable.
type PublishOK struct {
	Partition uint32
	Offset    uint64
	Duplicate bool // the producer id and sequence had been seen; Offset is the original's
	// Next is an appended field: 1 + the partition the broker would choose
	// now for a keyless publish to the same queue (the less loaded of two,
	// docs/protocol.md 5.6, "Partition hints"), or 0 for no hint. A client
	// may send its next keyless publish to that partition.
	Next uint32
}

// DeleteQueue removes a queue with every message in it (ready, delayed,
// inflight and awaiting a dead-letter copy) and ends its subscriptions with
// SubClosedQueueDeleted. It is answered by OK once the removal is durable, or
// by ERROR not_found when there is no such queue.
type DeleteQueue struct {
	Topic string
	Group string
}

// PurgeQueue discards every queued (ready or delayed) message of a queue that
// was published before the purge; inflight messages stay with their consumers.
// It is answered by PurgeOK once the discards are durable.
type PurgeQueue struct {
	Topic string
	Group string
}

// PurgeOK answers PurgeQueue.
type PurgeOK struct {
	Purged uint64 // messages discarded, summed over the queue's partitions
}

// Ack modes for Subscribe.
const (
	AckManual uint8 = 0
	AckAuto   uint8 = 1
)

// Subscribe attaches a consumer. Partition < 0 means every partition of the queue.
// With a Cohort (appended field, with Member) the subscription is a member of
// that cohort: it is delivered only the partitions assigned to it (see
// Assignment). Both are encoded only when Cohort is set.
type Subscribe struct {
	Topic     string
	Group     string
	Partition int32
	AckMode   uint8
	Prefetch  uint32 // most unsettled deliveries at once; 0 = server default
	Cohort    string // the cohort (consumer group) to join; "" for a plain consumer (appended field)
	Member    string // the member id within the cohort (appended field)
}

// Assignment states.
const (
	AssignmentAssigned uint8 = 1 // the partition is this subscription's now
	AssignmentRevoked  uint8 = 2 // the partition passed to another member, or to nobody
)

// Assignment tells a cohort subscription that one partition was assigned to
// it or revoked from it. Epoch is the partition's assignment epoch, which
// rises with every move; deliveries carry it too (Deliver.Assignment).
type Assignment struct {
	SubID     uint64
	Partition uint32
	Epoch     uint64
	State     uint8
}

// SubscribeOK answers Subscribe.
type SubscribeOK struct {
	SubID      uint64
	Partitions []uint32
	Prefetch   uint32 // the prefetch in force after clamping
}

// Unsubscribe detaches a consumer; its unsettled deliveries return to the queue.
type Unsubscribe struct{ SubID uint64 }

// Subscription close reasons, carried in SUB_CLOSED.
const (
	SubClosedUnsubscribed uint8 = 1 // the client asked
	SubClosedReconciled   uint8 = 2 // reconciliation dropped it
	SubClosedQueueDeleted uint8 = 3 // the queue went away
	SubClosedError        uint8 = 4 // the broker failed the subscription (see Code)
	SubClosedShutdown     uint8 = 5 // the broker is stopping
)

// SubClosed tells the client that the server ended a subscription.
type SubClosed struct {
	SubID   uint64
	Reason  uint8
	Code    Code
	Message string
}

// Deliver pushes one leased message. Tag identifies this lease on this session and
// is what ACK, NACK and FAIL carry. LeaseID and Epoch name the lease itself, so a
// settle can carry a LeaseRef that names exactly one lease even where the tag is
// no longer known to the session.
type Deliver struct {
	SubID         uint64
	Tag           uint64
	Partition     uint32
	Offset        uint64
	Attempt       uint32
	PublishedAtMs int64
	Key           []byte
	Headers       []Header
	ContentType   string
	Body          []byte
	Topic         string
	Group         string
	LeaseID       uint64 // the queue's lease id of this delivery (appended field)
	Epoch         uint64 // the owner's raft term when it granted the lease in a cluster; 0 on a single node (appended field)
	// LeaseMs (appended field) is what was left of the lease, in ms, when
	// the frame was written; 0 when not given (a single node). A client
	// drops a delivery it could not hand to the application in that time:
	// the message has gone back to the queue.
	LeaseMs uint32
	// Assignment (appended field) is the partition's assignment epoch when
	// the lease was granted (see Assignment); 0 while no cohort ever held
	// the partition.
	Assignment uint64
}

// LeaseRef names one lease: the subscription and partition it was delivered on,
// the message offset, the queue's lease id and the epoch.
type LeaseRef struct {
	SubID     uint64
	Partition uint32
	Offset    uint64
	LeaseID   uint64
	Epoch     uint64
}

// Settle is the body of ACK, NACK and FAIL: one or more delivery tags settled the
// same way. DelayMs applies to NACK only (requeue after a delay). Leases is
// either empty or parallel to Tags (Leases[i] is the lease Tags[i] was delivered
// with); the decoder accepts any length and the server refuses a mismatch.
type Settle struct {
	Kind    Op
	Tags    []uint64
	DelayMs int64
	Leases  []LeaseRef // appended field
}

// Extend renews the leases of one or more deliveries without settling them:
// each lease's deadline becomes now + ExtendMs at the partition's owner (it may
// move earlier as well as later). It is not a delivery attempt and keeps the
// lease id, so a later settle by the same LeaseRef applies. Leases is either
// empty or parallel to Tags, as in Settle. It is answered by SettleResult.
type Extend struct {
	Tags     []uint64
	ExtendMs int64
	Leases   []LeaseRef
}

// SettleResult answers a settle request: Codes[i] is the outcome of Tags[i]
// (CodeOK, CodeStaleLease, CodeUnknownTag ...).
type SettleResult struct {
	Codes []Code
}

// GoingAway announces that the broker will stop. The client should stop starting new
// work on this connection and reconnect after the connection closes; its session
// stays resumable for GraceMs after the broker comes back.
type GoingAway struct {
	DeadlineMs int64 // Unix ms by which the broker will have closed the connection
	GraceMs    uint32
	Reason     string
	Redirect   string // another endpoint to use, when one is known (cluster mode)
}

// Reconciliation policies.
const (
	ReconcileConservative uint8 = 0 // close anything that does not match
	ReconcileRestore      uint8 = 1 // recreate client-side subscriptions missing on the server
)

// SubView is one side's view of a subscription during reconciliation.
type SubView struct {
	SubID     uint64
	Topic     string
	Group     string
	Partition int32
	AckMode   uint8
	Prefetch  uint32
}

// Reconcile lists the subscriptions a resumed client still holds.
// InflightFollows says that the client sends INFLIGHT next: the server then
// holds back its re-sends until INFLIGHT tells it which deliveries the client
// lacks, instead of re-sending every unsettled one after RECONCILE_RESULT.
//
// Cohorts (appended field, encoded only when not empty) names the cohort
// and member of each listed subscription that is a cohort member, so a
// recreated subscription joins its cohort again.
type Reconcile struct {
	Policy          uint8
	Subs            []SubView
	InflightFollows bool // appended field
	Cohorts         []SubCohort
}

// SubCohort names the cohort and member of subscription SubID.
type SubCohort struct {
	SubID  uint64
	Cohort string
	Member string
}

// Reconciliation actions.
const (
	ActionKeep            uint8 = 1
	ActionCloseClientSide uint8 = 2
	ActionCloseServerSide uint8 = 3
	ActionRecreateClient  uint8 = 4
)

// ReconcileEntry is the broker's decision for one subscription.
type ReconcileEntry struct {
	Action      uint8
	ClientSubID uint64 // 0 for server-only subscriptions
	ServerSubID uint64 // the id to use from now on (new id when recreated)
	Client      SubView
	Server      SubView
	Reason      string
}

// ReconcileResult answers Reconcile.
type ReconcileResult struct{ Entries []ReconcileEntry }

// EndSession ends the session at once: its subscriptions close, its unsettled
// leases go back to the queue without using a retry, and its resume identity
// stops working. The server answers OK and then closes the connection.
type EndSession struct{}

// InflightEntry is one manual-ack delivery a resumed client still holds unsettled.
type InflightEntry struct {
	Tag   uint64
	Lease LeaseRef
}

// Inflight lists the deliveries a resumed client still holds unsettled. It is
// sent after RECONCILE and before any other request.
type Inflight struct{ Entries []InflightEntry }

// InflightResult answers Inflight. The server writes the Resent deliveries
// before it.
type InflightResult struct {
	Stale  []uint64 // tags the session no longer holds; the client ends them locally
	Resent uint64   // deliveries re-sent because the client lacked them
	Kept   uint64   // deliveries the client reported that are still held
}

// ----- encoding -----

func (*Hello) Op() Op { return OpHello }
func (m *Hello) AppendBody(b []byte) []byte {
	e := enc{b}
	e.uvarint(uint64(m.ProtocolVersion))
	e.str(m.ClientName)
	e.str(m.ClientVersion)
	e.str(m.Credentials)
	e.resume(m.Resume)
	e.str(m.User)
	return e.b
}
func (m *Hello) decode(d *dec) {
	v := d.at("protocol_version").uvarint()
	if v > 0xFFFF {
		d.fail("out of range")
	}
	m.ProtocolVersion = uint16(v)
	m.ClientName = d.at("client_name").str()
	m.ClientVersion = d.at("client_version").str()
	m.Credentials = d.at("credentials").str()
	m.Resume = d.at("resume").resume()
	if d.optional() {
		m.User = d.at("user").str()
	}
}

func (e *enc) resume(r ResumeIdentity) { e.str(r.ClientID); e.str(r.OwnerID); e.bytes(r.Token) }
func (d *dec) resume() ResumeIdentity {
	var r ResumeIdentity
	r.ClientID = d.str()
	r.OwnerID = d.str()
	if t := d.bytes(); len(t) > 0 {
		r.Token = append([]byte(nil), t...)
	}
	return r
}

func (*HelloOK) Op() Op { return OpHelloOK }
func (m *HelloOK) AppendBody(b []byte) []byte {
	e := enc{b}
	e.uvarint(uint64(m.ProtocolVersion))
	e.str(m.ServerVersion)
	e.resume(m.Resume)
	e.u8(uint8(m.Outcome))
	e.uvarint(m.ServerGeneration)
	e.uvarint(uint64(m.HeartbeatMs))
	e.uvarint(uint64(m.ReconnectGraceMs))
	l := m.Limits
	for _, v := range []uint32{l.FrameBytesMax, l.BodyBytesMax, l.PrefetchMax, l.SettleBatchMax, l.PublishInflightMax, l.SubscriptionsMax} {
		e.uvarint(uint64(v))
	}
	e.boolean(m.Cluster)
	return e.b
}
func (m *HelloOK) decode(d *dec) {
	v := d.at("protocol_version").uvarint()
	if v > 0xFFFF {
		d.fail("out of range")
	}
	m.ProtocolVersion = uint16(v)
	m.ServerVersion = d.at("server_version").str()
	m.Resume = d.at("resume").resume()
	m.Outcome = ResumeOutcome(d.at("outcome").u8())
	m.ServerGeneration = d.at("server_generation").uvarint()
	m.HeartbeatMs = d.at("heartbeat_ms").u32()
	m.ReconnectGraceMs = d.at("reconnect_grace_ms").u32()
	d.at("limits")
	m.Limits = Limits{d.u32(), d.u32(), d.u32(), d.u32(), d.u32(), d.u32()}
	if d.optional() {
		m.Cluster = d.at("cluster").boolean()
	}
}

func (*Ping) Op() Op                     { return OpPing }
func (*Ping) AppendBody(b []byte) []byte { return b }
func (*Ping) decode(*dec)                {}
func (*Pong) Op() Op                     { return OpPong }
func (*Pong) AppendBody(b []byte) []byte { return b }
func (*Pong) decode(*dec)                {}
func (*OK) Op() Op                       { return OpOK }
func (*OK) AppendBody(b []byte) []byte   { return b }
func (*OK) decode(*dec)                  {}
func (*ErrorBody) Op() Op                { return OpError }
func (m *ErrorBody) AppendBody(b []byte) []byte {
	e := enc{b}
	e.uvarint(uint64(m.Code))
	e.str(m.Message)
	e.boolean(m.Fatal)
	e.str(m.Owner) // appended field
	return e.b
}
func (m *ErrorBody) decode(d *dec) {
	c := d.at("code").uvarint()
	if c > 0xFFFF {
		d.fail("out of range")
	}
	m.Code = Code(c)
	m.Message = d.at("message").str()
	m.Fatal = d.at("fatal").boolean()
	if d.optional() {
		m.Owner = d.at("owner").str()
	}
}

// Err converts the body into an *Error.
func (m *ErrorBody) Err() *Error { return &Error{Code: m.Code, Message: m.Message, Owner: m.Owner} }

func (*DeclareQueue) Op() Op { return OpDeclareQueue }
func (m *DeclareQueue) AppendBody(b []byte) []byte {
	e := enc{b}
	e.str(m.Topic)
	e.str(m.Group)
	e.uvarint(uint64(m.Partitions))
	e.u8(m.DeadLetterMode)
	e.str(m.DeadLetterTarget)
	e.varint(int64(m.MaxRetries))
	e.varint(m.DefaultTTLMs)
	e.varint(m.LeaseMs)
	return e.b
}
func (m *DeclareQueue) decode(d *dec) {
	m.Topic = d.at("topic").str()
	m.Group = d.at("group").str()
	m.Partitions = d.at("partitions").u32()
	m.DeadLetterMode = d.at("dead_letter_mode").u8()
	m.DeadLetterTarget = d.at("dead_letter_target").str()
	m.MaxRetries = d.at("max_retries").i32()
	m.DefaultTTLMs = d.at("default_ttl_ms").varint()
	m.LeaseMs = d.at("lease_ms").varint()
}

func (*DeclareOK) Op() Op { return OpDeclareOK }
func (m *DeclareOK) AppendBody(b []byte) []byte {
	e := enc{b}
	e.uvarint(uint64(m.Partitions))
	e.boolean(m.Created)
	return e.b
}
func (m *DeclareOK) decode(d *dec) {
	m.Partitions = d.at("partitions").u32()
	m.Created = d.at("created").boolean()
}

func (*Publish) Op() Op { return OpPublish }
func (m *Publish) AppendBody(b []byte) []byte {
	e := enc{b}
	e.str(m.Topic)
	e.str(m.Group)
	e.varint(int64(m.Partition))
	e.bytes(m.Key)
	e.headers(m.Headers)
	e.str(m.ContentType)
	e.varint(m.DelayMs)
	e.varint(m.NotBeforeMs)
	e.varint(m.TTLMs)
	e.str(m.ProducerID)
	e.uvarint(m.ProducerSeq)
	e.bytes(m.Body)
	e.uvarint(m.ProducerPrev)
	return e.b
}
func (m *Publish) decode(d *dec) {
	m.Topic = d.at("topic").str()
	m.Group = d.at("group").str()
	m.Partition = d.at("partition").i32()
	m.Key = d.at("key").bytes()
	m.Headers = d.at("headers").headers()
	m.ContentType = d.at("content_type").str()
	m.DelayMs = d.at("delay_ms").varint()
	m.NotBeforeMs = d.at("not_before_ms").varint()
	m.TTLMs = d.at("ttl_ms").varint()
	m.ProducerID = d.at("producer_id").str()
	m.ProducerSeq = d.at("producer_seq").uvarint()
	m.Body = d.at("body").bytes()
	if d.optional() {
		m.ProducerPrev = d.at("producer_prev").uvarint()
	}
}

func (*PublishOK) Op() Op { return OpPublishOK }
func (m *PublishOK) AppendBody(b []byte) []byte {
	e := enc{b}
	e.uvarint(uint64(m.Partition))
	e.uvarint(m.Offset)
	e.boolean(m.Duplicate)
	if m.Next != 0 {
		e.uvarint(uint64(m.Next))
	}
	return e.b
}
func (m *PublishOK) decode(d *dec) {
	m.Partition = d.at("partition").u32()
	m.Offset = d.at("offset").uvarint()
	m.Duplicate = d.at("duplicate").boolean()
	if d.optional() {
		m.Next = d.at("next").u32()
	}
}

func (*DeleteQueue) Op() Op { return OpDeleteQueue }
func (m *DeleteQueue) AppendBody(b []byte) []byte {
	e := enc{b}
	e.str(m.Topic)
	e.str(m.Group)
	return e.b
}
func (m *DeleteQueue) decode(d *dec) {
	m.Topic = d.at("topic").str()
	m.Group = d.at("group").str()
}

func (*PurgeQueue) Op() Op { return OpPurgeQueue }
func (m *PurgeQueue) AppendBody(b []byte) []byte {
	e := enc{b}
	e.str(m.Topic)
	e.str(m.Group)
	return e.b
}
func (m *PurgeQueue) decode(d *dec) {
	m.Topic = d.at("topic").str()
	m.Group = d.at("group").str()
}

func (*PurgeOK) Op() Op                       { return OpPurgeOK }
func (m *PurgeOK) AppendBody(b []byte) []byte { e := enc{b}; e.uvarint(m.Purged); return e.b }
func (m *PurgeOK) decode(d *dec)              { m.Purged = d.at("purged").uvarint() }

func (*Subscribe) Op() Op { return OpSubscribe }
func (m *Subscribe) AppendBody(b []byte) []byte {
	e := enc{b}
	e.str(m.Topic)
	e.str(m.Group)
	e.varint(int64(m.Partition))
	e.u8(m.AckMode)
	e.uvarint(uint64(m.Prefetch))
	if m.Cohort != "" || m.Member != "" {
		e.str(m.Cohort)
		e.str(m.Member)
	}
	return e.b
}
func (m *Subscribe) decode(d *dec) {
	m.Topic = d.at("topic").str()
	m.Group = d.at("group").str()
	m.Partition = d.at("partition").i32()
	m.AckMode = d.at("ack_mode").u8()
	m.Prefetch = d.at("prefetch").u32()
	if d.optional() {
		m.Cohort = d.at("cohort").str()
		m.Member = d.at("member").str()
	}
}

func (*Assignment) Op() Op { return OpAssignment }
func (m *Assignment) AppendBody(b []byte) []byte {
	e := enc{b}
	e.uvarint(m.SubID)
	e.uvarint(uint64(m.Partition))
	e.uvarint(m.Epoch)
	e.u8(m.State)
	return e.b
}
func (m *Assignment) decode(d *dec) {
	m.SubID = d.at("sub_id").uvarint()
	m.Partition = d.at("partition").u32()
	m.Epoch = d.at("epoch").uvarint()
	m.State = d.at("state").u8()
	if d.err == nil && m.State != AssignmentAssigned && m.State != AssignmentRevoked {
		d.fail("out of range")
	}
}

func (*SubscribeOK) Op() Op { return OpSubscribeOK }
func (m *SubscribeOK) AppendBody(b []byte) []byte {
	e := enc{b}
	e.uvarint(m.SubID)
	e.uvarint(uint64(len(m.Partitions)))
	for _, p := range m.Partitions {
		e.uvarint(uint64(p))
	}
	e.uvarint(uint64(m.Prefetch))
	return e.b
}
func (m *SubscribeOK) decode(d *dec) {
	m.SubID = d.at("sub_id").uvarint()
	n := d.at("partitions").count(listItemsMax, 1)
	if n > 0 {
		m.Partitions = make([]uint32, n)
		for i := range m.Partitions {
			m.Partitions[i] = d.u32()
		}
	}
	m.Prefetch = d.at("prefetch").u32()
}

func (*Unsubscribe) Op() Op                       { return OpUnsubscribe }
func (m *Unsubscribe) AppendBody(b []byte) []byte { e := enc{b}; e.uvarint(m.SubID); return e.b }
func (m *Unsubscribe) decode(d *dec)              { m.SubID = d.at("sub_id").uvarint() }

func (*SubClosed) Op() Op { return OpSubClosed }
func (m *SubClosed) AppendBody(b []byte) []byte {
	e := enc{b}
	e.uvarint(m.SubID)
	e.u8(m.Reason)
	e.uvarint(uint64(m.Code))
	e.str(m.Message)
	return e.b
}
func (m *SubClosed) decode(d *dec) {
	m.SubID = d.at("sub_id").uvarint()
	m.Reason = d.at("reason").u8()
	c := d.at("code").uvarint()
	if c > 0xFFFF {
		d.fail("out of range")
	}
	m.Code = Code(c)
	m.Message = d.at("message").str()
}

func (*Deliver) Op() Op { return OpDeliver }
func (m *Deliver) AppendBody(b []byte) []byte {
	e := enc{b}
	e.uvarint(m.SubID)
	e.uvarint(m.Tag)
	e.uvarint(uint64(m.Partition))
	e.uvarint(m.Offset)
	e.uvarint(uint64(m.Attempt))
	e.varint(m.PublishedAtMs)
	e.bytes(m.Key)
	e.headers(m.Headers)
	e.str(m.ContentType)
	e.bytes(m.Body)
	e.str(m.Topic)
	e.str(m.Group)
	e.uvarint(m.LeaseID)
	e.uvarint(m.Epoch)
	e.uvarint(uint64(m.LeaseMs))
	e.uvarint(m.Assignment)
	return e.b
}
func (m *Deliver) decode(d *dec) {
	m.SubID = d.at("sub_id").uvarint()
	m.Tag = d.at("tag").uvarint()
	m.Partition = d.at("partition").u32()
	m.Offset = d.at("offset").uvarint()
	m.Attempt = d.at("attempt").u32()
	m.PublishedAtMs = d.at("published_at_ms").varint()
	m.Key = d.at("key").bytes()
	m.Headers = d.at("headers").headers()
	m.ContentType = d.at("content_type").str()
	m.Body = d.at("body").bytes()
	m.Topic = d.at("topic").str()
	m.Group = d.at("group").str()
	if d.optional() {
		m.LeaseID = d.at("lease_id").uvarint()
		m.Epoch = d.at("epoch").uvarint()
	}
	if d.optional() {
		m.LeaseMs = d.at("lease_ms").u32()
	}
	if d.optional() {
		m.Assignment = d.at("assignment").uvarint()
	}
}

// leaseRefBytesMin is the smallest encoding of a lease_ref: five one-byte uvarints.
const leaseRefBytesMin = 5

func (e *enc) leaseRef(r LeaseRef) {
	e.uvarint(r.SubID)
	e.uvarint(uint64(r.Partition))
	e.uvarint(r.Offset)
	e.uvarint(r.LeaseID)
	e.uvarint(r.Epoch)
}
func (d *dec) leaseRef() LeaseRef {
	return LeaseRef{SubID: d.uvarint(), Partition: d.u32(), Offset: d.uvarint(), LeaseID: d.uvarint(), Epoch: d.uvarint()}
}

// appendLeaseOp encodes the body shared by the settles and EXTEND: tags, a
// signed milliseconds field (delay_ms or extend_ms), leases.
func appendLeaseOp(b []byte, tags []uint64, ms int64, leases []LeaseRef) []byte {
	e := enc{b}
	e.uvarint(uint64(len(tags)))
	for _, t := range tags {
		e.uvarint(t)
	}
	e.varint(ms)
	e.uvarint(uint64(len(leases)))
	for _, r := range leases {
		e.leaseRef(r)
	}
	return e.b
}

func (d *dec) tags() []uint64 {
	n := d.at("tags").count(listItemsMax, 1)
	if n == 0 {
		return nil
	}
	tags := make([]uint64, n)
	for i := range tags {
		tags[i] = d.uvarint()
	}
	return tags
}

func (d *dec) leaseRefs() []LeaseRef {
	n := d.at("leases").count(listItemsMax, leaseRefBytesMin)
	if n == 0 {
		return nil
	}
	refs := make([]LeaseRef, n)
	for i := range refs {
		refs[i] = d.leaseRef()
	}
	return refs
}

func (m *Settle) Op() Op { return m.Kind }
func (m *Settle) AppendBody(b []byte) []byte {
	return appendLeaseOp(b, m.Tags, m.DelayMs, m.Leases)
}
func (m *Settle) decode(d *dec) {
	m.Tags = d.tags()
	m.DelayMs = d.at("delay_ms").varint()
	if d.optional() {
		m.Leases = d.leaseRefs()
	}
}

func (*Extend) Op() Op { return OpExtend }
func (m *Extend) AppendBody(b []byte) []byte {
	return appendLeaseOp(b, m.Tags, m.ExtendMs, m.Leases)
}

// decode reads every field: EXTEND was defined with its leases list, so a body
// without it is malformed (unlike the settles, where the list was appended).
func (m *Extend) decode(d *dec) {
	m.Tags = d.tags()
	m.ExtendMs = d.at("extend_ms").varint()
	m.Leases = d.leaseRefs()
}

func (*SettleResult) Op() Op { return OpSettleResult }
func (m *SettleResult) AppendBody(b []byte) []byte {
	e := enc{b}
	e.uvarint(uint64(len(m.Codes)))
	for _, c := range m.Codes {
		e.uvarint(uint64(c))
	}
	return e.b
}
func (m *SettleResult) decode(d *dec) {
	n := d.at("codes").count(listItemsMax, 1)
	if n > 0 {
		m.Codes = make([]Code, n)
		for i := range m.Codes {
			c := d.uvarint()
			if c > 0xFFFF {
				d.fail("out of range")
			}
			m.Codes[i] = Code(c)
		}
	}
}

func (*GoingAway) Op() Op { return OpGoingAway }
func (m *GoingAway) AppendBody(b []byte) []byte {
	e := enc{b}
	e.varint(m.DeadlineMs)
	e.uvarint(uint64(m.GraceMs))
	e.str(m.Reason)
	e.str(m.Redirect)
	return e.b
}
func (m *GoingAway) decode(d *dec) {
	m.DeadlineMs = d.at("deadline_ms").varint()
	m.GraceMs = d.at("grace_ms").u32()
	m.Reason = d.at("reason").str()
	m.Redirect = d.at("redirect").str()
}

func (e *enc) subView(v SubView) {
	e.uvarint(v.SubID)
	e.str(v.Topic)
	e.str(v.Group)
	e.varint(int64(v.Partition))
	e.u8(v.AckMode)
	e.uvarint(uint64(v.Prefetch))
}
func (d *dec) subView() SubView {
	return SubView{SubID: d.uvarint(), Topic: d.str(), Group: d.str(), Partition: d.i32(), AckMode: d.u8(), Prefetch: d.u32()}
}

func (*Reconcile) Op() Op { return OpReconcile }
func (m *Reconcile) AppendBody(b []byte) []byte {
	e := enc{b}
	e.u8(m.Policy)
	e.uvarint(uint64(len(m.Subs)))
	for _, s := range m.Subs {
		e.subView(s)
	}
	e.boolean(m.InflightFollows)
	if len(m.Cohorts) > 0 {
		e.uvarint(uint64(len(m.Cohorts)))
		for _, c := range m.Cohorts {
			e.uvarint(c.SubID)
			e.str(c.Cohort)
			e.str(c.Member)
		}
	}
	return e.b
}
func (m *Reconcile) decode(d *dec) {
	m.Policy = d.at("policy").u8()
	n := d.at("subs").count(listItemsMax, 6)
	for i := 0; i < n && d.err == nil; i++ {
		m.Subs = append(m.Subs, d.subView())
	}
	if d.optional() {
		m.InflightFollows = d.at("inflight_follows").boolean()
	}
	if d.optional() {
		n := d.at("cohorts").count(listItemsMax, 3)
		for i := 0; i < n && d.err == nil; i++ {
			m.Cohorts = append(m.Cohorts, SubCohort{SubID: d.uvarint(), Cohort: d.str(), Member: d.str()})
		}
	}
}

func (*ReconcileResult) Op() Op { return OpReconcileResult }
func (m *ReconcileResult) AppendBody(b []byte) []byte {
	e := enc{b}
	e.uvarint(uint64(len(m.Entries)))
	for _, x := range m.Entries {
		e.u8(x.Action)
		e.uvarint(x.ClientSubID)
		e.uvarint(x.ServerSubID)
		e.subView(x.Client)
		e.subView(x.Server)
		e.str(x.Reason)
	}
	return e.b
}
func (m *ReconcileResult) decode(d *dec) {
	n := d.at("entries").count(listItemsMax, 16)
	for i := 0; i < n && d.err == nil; i++ {
		var x ReconcileEntry
		x.Action = d.u8()
		x.ClientSubID = d.uvarint()
		x.ServerSubID = d.uvarint()
		x.Client = d.subView()
		x.Server = d.subView()
		x.Reason = d.str()
		m.Entries = append(m.Entries, x)
	}
}

func (*EndSession) Op() Op                     { return OpEndSession }
func (*EndSession) AppendBody(b []byte) []byte { return b }
func (*EndSession) decode(*dec)                {}

func (*Inflight) Op() Op { return OpInflight }
func (m *Inflight) AppendBody(b []byte) []byte {
	e := enc{b}
	e.uvarint(uint64(len(m.Entries)))
	for _, x := range m.Entries {
		e.uvarint(x.Tag)
		e.leaseRef(x.Lease)
	}
	return e.b
}
func (m *Inflight) decode(d *dec) {
	n := d.at("entries").count(listItemsMax, 1+leaseRefBytesMin)
	if n > 0 {
		m.Entries = make([]InflightEntry, n)
		for i := range m.Entries {
			m.Entries[i].Tag = d.uvarint()
			m.Entries[i].Lease = d.leaseRef()
		}
	}
}

func (*InflightResult) Op() Op { return OpInflightResult }
func (m *InflightResult) AppendBody(b []byte) []byte {
	e := enc{b}
	e.uvarint(uint64(len(m.Stale)))
	for _, t := range m.Stale {
		e.uvarint(t)
	}
	e.uvarint(m.Resent)
	e.uvarint(m.Kept)
	return e.b
}
func (m *InflightResult) decode(d *dec) {
	n := d.at("stale").count(listItemsMax, 1)
	if n > 0 {
		m.Stale = make([]uint64, n)
		for i := range m.Stale {
			m.Stale[i] = d.uvarint()
		}
	}
	m.Resent = d.at("resent").uvarint()
	m.Kept = d.at("kept").uvarint()
}

// Metadata asks where a queue's partitions are served. It is answered by
// MetadataResult.
type Metadata struct {
	Topic, Group string
}

// MetadataResult answers Metadata. On a single node Cluster is false and
// every partition is served by the node that answered (Owner and Replicas
// empty, Epoch 0).
type MetadataResult struct {
	Cluster    bool
	Partitions []PartitionMeta
}

// PartitionMeta is one partition's place in a cluster: its owner's client
// address ("" while no owner is known to the answering node), the owner's
// epoch (its raft term; DELIVER carries the same), and the client addresses
// of its replicas.
type PartitionMeta struct {
	Partition uint32
	Owner     string
	Epoch     uint64
	Replicas  []string
}

func (*Metadata) Op() Op { return OpMetadata }
func (m *Metadata) AppendBody(b []byte) []byte {
	e := enc{b}
	e.str(m.Topic)
	e.str(m.Group)
	return e.b
}
func (m *Metadata) decode(d *dec) {
	m.Topic = d.at("topic").str()
	m.Group = d.at("group").str()
}

// metadataReplicasMax bounds the replicas listed per partition.
const metadataReplicasMax = 64

func (*MetadataResult) Op() Op { return OpMetadataResult }
func (m *MetadataResult) AppendBody(b []byte) []byte {
	e := enc{b}
	e.boolean(m.Cluster)
	e.uvarint(uint64(len(m.Partitions)))
	for _, p := range m.Partitions {
		e.uvarint(uint64(p.Partition))
		e.str(p.Owner)
		e.uvarint(p.Epoch)
		e.uvarint(uint64(len(p.Replicas)))
		for _, r := range p.Replicas {
			e.str(r)
		}
	}
	return e.b
}
func (m *MetadataResult) decode(d *dec) {
	m.Cluster = d.at("cluster").boolean()
	n := d.at("partitions").count(listItemsMax, 4)
	if n > 0 {
		m.Partitions = make([]PartitionMeta, n)
		for i := range m.Partitions {
			p := &m.Partitions[i]
			p.Partition = d.at("partition").u32()
			p.Owner = d.at("owner").str()
			p.Epoch = d.at("epoch").uvarint()
			k := d.at("replicas").count(metadataReplicasMax, 1)
			if k > 0 {
				p.Replicas = make([]string, k)
				for j := range p.Replicas {
					p.Replicas[j] = d.str()
				}
			}
		}
	}
}
