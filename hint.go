package sinew

import (
	"math"
	"sync"

	"github.com/sinewmq/sinew/protocol"
)

// Partition hints (docs/protocol.md 5.6, "Partition hints"). The broker
// places a keyless publish by the hash of its producer id and sequence, so
// that a resend finds the partition that remembers it; it cannot place it
// by load, or a resend could land elsewhere and be stored twice. Its answer
// to a keyless publish names instead the partition it would choose now, the
// less loaded of two (PublishOK.Next). The Client sends its next keyless
// publish to the queue to that partition, explicitly: resends keep the
// partition, so deduplication holds, and the keyless publishes lean toward
// the partitions with less waiting. A publish whose hinted partition is
// gone (not_found) is sent again without a hint.

// hintsMax bounds the queues whose hint a Client keeps; past it the map
// starts over (a hint is advice: without one a publish is hashed).
const hintsMax = 4096

type hintKey struct{ topic, group string }

// hints is the last partition hint per queue.
type hints struct {
	mu sync.Mutex
	m  map[hintKey]int32
}

// take returns the partition to send a keyless publish of topic/group
// to, if the broker hinted one.
func (h *hints) take(topic, group string) (int32, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p, ok := h.m[hintKey{topic, group}]
	return p, ok
}

// note keeps the hint of a keyless publish's answer: next is
// PublishOK.Next (1 + the partition, 0 for none, which drops the hint).
func (h *hints) note(topic, group string, next uint32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := hintKey{topic, group}
	if next == 0 || next > math.MaxInt32 {
		delete(h.m, k)
		return
	}
	if _, known := h.m[k]; h.m == nil || (len(h.m) >= hintsMax && !known) {
		h.m = make(map[hintKey]int32)
	}
	h.m[k] = int32(next - 1)
}

// drop forgets the hint of topic/group.
func (h *hints) drop(topic, group string) {
	h.mu.Lock()
	delete(h.m, hintKey{topic, group})
	h.mu.Unlock()
}

// hintable reports whether p is a publish the Client may send to a hinted
// partition: keyless, with no partition chosen by the application, and
// numbered by the Client (its resends then carry the partition along).
func (c *Client) hintable(p *protocol.Publish) bool {
	return p.Partition < 0 && len(p.Key) == 0 && p.ProducerID == c.o.producerID && p.ProducerID != "" && p.ProducerSeq == 0
}
