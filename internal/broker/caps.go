package broker

import (
	"strconv"

	"github.com/sinewmq/sinew/protocol"
)

// Caps on how far into the future a message can be scheduled.
//
// A delayed message, a message with a long TTL or a NACK with a long delay
// stays unsettled until its time comes, and the log cannot be reclaimed
// past the oldest unsettled message; unbounded times let one message pin a
// partition's disk for years. So every such time has a cap, configurable,
// 30 days by default:
//
//	input                                        cap             beyond the cap
//	-------------------------------------------  --------------  -------------------------------
//	PUBLISH delay_ms                             DelayMsMax      bad_request, nothing stored
//	PUBLISH not_before_ms - now                  DelayMsMax      bad_request, nothing stored
//	PUBLISH ttl_ms                               TTLMsMax        bad_request, nothing stored
//	DECLARE_QUEUE default_ttl_ms                 TTLMsMax        bad_request, queue unchanged
//	NACK delay_ms                                NackDelayMsMax  bad_request, the lease stays
//
// A NACK beyond the cap is refused rather than clamped: the consumer asked
// for something the broker will not do, and a silent shorter delay would
// redeliver earlier than it expects. The lease it tried to settle stays
// held, so the consumer may settle it again.
const (
	// DelayMsMaxDefault is Config.DelayMsMax when left zero: 30 days.
	DelayMsMaxDefault = 30 * 24 * 3600 * 1000
	// TTLMsMaxDefault is Config.TTLMsMax when left zero: 30 days.
	TTLMsMaxDefault = 30 * 24 * 3600 * 1000
	// NackDelayMsMaxDefault is Config.NackDelayMsMax when left zero: 30
	// days.
	NackDelayMsMaxDefault = 30 * 24 * 3600 * 1000
	// TimeCapMsMax bounds the three caps themselves (100 years), so that
	// now plus a cap never comes near overflowing an int64.
	TimeCapMsMax = 100 * 365 * 24 * 3600 * 1000
)

// normalizeCap resolves a cap setting: its default when <= 0, at most
// TimeCapMsMax.
func normalizeCap(v, def int64) int64 {
	if v <= 0 {
		return def
	}
	return min(v, TimeCapMsMax)
}

// checkTimes refuses a publish that schedules beyond the caps. nowMs is the
// broker's clock; not_before_ms is absolute.
func (b *Broker) checkTimes(p *protocol.Publish, nowMs int64) error {
	switch {
	case p.DelayMs > b.cfg.DelayMsMax:
		return protocol.Errorf(protocol.CodeBadRequest,
			"delay_ms %d is above the maximum delay of %d ms (%s)", p.DelayMs, b.cfg.DelayMsMax, days(b.cfg.DelayMsMax))
	case p.NotBeforeMs > 0 && p.NotBeforeMs-nowMs > b.cfg.DelayMsMax:
		return protocol.Errorf(protocol.CodeBadRequest,
			"not_before_ms %d is %d ms from now, above the maximum delay of %d ms (%s)",
			p.NotBeforeMs, p.NotBeforeMs-nowMs, b.cfg.DelayMsMax, days(b.cfg.DelayMsMax))
	case p.TTLMs > b.cfg.TTLMsMax:
		return protocol.Errorf(protocol.CodeBadRequest,
			"ttl_ms %d is above the maximum TTL of %d ms (%s)", p.TTLMs, b.cfg.TTLMsMax, days(b.cfg.TTLMsMax))
	}
	return nil
}

// checkDefaultTTL refuses a declaration whose default TTL is beyond the cap.
func (b *Broker) checkDefaultTTL(ttlMs int64) error {
	if ttlMs > b.cfg.TTLMsMax {
		return protocol.Errorf(protocol.CodeBadRequest,
			"default_ttl_ms %d is above the maximum TTL of %d ms (%s)", ttlMs, b.cfg.TTLMsMax, days(b.cfg.TTLMsMax))
	}
	return nil
}

// days renders a cap for people: "30 days", or "2.5 days".
func days(ms int64) string {
	const day = 24 * 3600 * 1000
	if ms%day == 0 {
		if ms == day {
			return "1 day"
		}
		return strconv.FormatInt(ms/day, 10) + " days"
	}
	return strconv.FormatFloat(float64(ms)/day, 'g', 4, 64) + " days"
}
