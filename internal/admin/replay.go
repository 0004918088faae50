package admin

import (
	"context"
	"errors"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/partition"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/protocol"
)

// replayOne puts one dead-letter copy back on its source queue and, unless
// keep, removes the copy once the replayed message is confirmed. The order
// is what makes it safe: a crash between the two leaves the message in
// both places (at least once), never in neither.
func (a *api) replayOne(ctx context.Context, topic string, it ReplayItem, keep bool) ReplayResult {
	b := a.cfg.Broker
	res := ReplayResult{Partition: it.Partition, Offset: it.Offset}
	fail := func(status string, err error) ReplayResult {
		res.Status, res.Error = status, err.Error()
		return res
	}
	pk, err := b.Peek(ctx, topic, "", it.Partition, it.Offset, 1)
	if err != nil {
		if protocol.CodeOf(err) == protocol.CodeNotFound {
			return fail("not_found", err)
		}
		return fail("error", err)
	}
	if len(pk.Messages) == 0 || pk.Messages[0].Info.Offset != it.Offset {
		return fail("not_found", errors.New("no unsettled message at this offset"))
	}
	m := &pk.Messages[0]
	if m.Msg == nil {
		return fail("error", m.Err)
	}
	src := broker.DeadLetterSourceOf(m.Msg.Headers)
	if !src.OK {
		return fail("not_found", errors.New("the message has no sinew.source.topic header: it is not a dead-letter copy"))
	}
	res.TargetTopic, res.TargetGroup = src.Topic, src.Group
	type published struct {
		ok  protocol.PublishOK
		err error
	}
	pc := make(chan published, 1)
	b.Publish(broker.ReplayPublish(src, m.Msg), func(ok protocol.PublishOK, err error) { pc <- published{ok, err} })
	var pub published
	select {
	case pub = <-pc:
	case <-ctx.Done():
		return fail("error", ctx.Err())
	}
	if pub.err != nil {
		return fail("error", pub.err)
	}
	res.Status, res.TargetPartition, res.TargetOffset = "replayed", pub.ok.Partition, pub.ok.Offset
	if keep {
		return res
	}
	if m.Info.State != queue.StateReady && m.Info.State != queue.StateDelayed {
		res.Error = "the dead-letter copy is " + m.Info.State.String() + " and was kept"
		return res
	}
	dc := make(chan error, 1)
	b.Discard(topic, "", it.Partition, it.Offset, func(err error) { dc <- err })
	select {
	case err = <-dc:
	case <-ctx.Done():
		err = ctx.Err()
	}
	switch {
	case err == nil:
		res.Removed = true
	case errors.Is(err, partition.ErrNotQueued):
		res.Error = "the dead-letter copy was leased or settled meanwhile and was kept"
	default:
		res.Error = "replayed, but the dead-letter copy was not removed: " + err.Error()
	}
	return res
}
