package delivery

import "github.com/sinewmq/sinew/protocol"

// Delivery is one leased message. Key, Headers and Body may be shared with
// other deliveries of the same message and are never modified.
type Delivery struct {
	// Partition is the partition's index in its queue (set by the broker).
	Partition     uint32
	Offset        uint64
	LeaseID       uint64
	Attempt       uint32
	PublishedAtMs int64
	Key           []byte
	Headers       []protocol.Header
	ContentType   string
	Body          []byte
	// Topic and Group name the queue (set by the broker).
	Topic, Group string
	// ExpiresAtMs, when not 0, is the lease's deadline (a replica of a
	// larger group's): a delivery not handed to the consumer's socket by
	// then is dropped rather than written later, since another owner may
	// have leased the message again meanwhile. 0 on a group of one.
	ExpiresAtMs int64
	// Epoch is the raft term of the owner that granted the lease (a replica
	// of a larger group's), the DELIVER's epoch; 0 on a group of one.
	Epoch uint64
	// Assignment is the partition's assignment epoch (queue.Gate) the lease
	// was granted under: it rises each time the partition passes to
	// another cohort member.
	Assignment uint64
}

// Headers converts a message's stored headers (any struct with the same
// Key and Value fields, such as queue.Header) into a delivery's; nil for
// none.
func Headers[H ~struct{ Key, Value string }](hs []H) []protocol.Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]protocol.Header, len(hs))
	for i, h := range hs {
		out[i] = protocol.Header(h)
	}
	return out
}
