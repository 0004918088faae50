package sinew

import (
	"context"
	"fmt"

	"github.com/sinewmq/sinew/protocol"
)

// DeleteQueue removes the queue topic in group ("" is the default group)
// with every message in it: ready, delayed, inflight, and dead-letter copies
// not yet made. Subscriptions to it, on every client, end with a
// *BrokerError whose Code is protocol.CodeNotFound. It returns once the
// removal is durable on the broker. A queue that does not exist is a
// *BrokerError with protocol.CodeNotFound; the queue is never created.
// Afterwards a publish or subscribe to the same name creates a new, empty
// queue with the broker's defaults.
//
// If the connection is lost before the answer, DeleteQueue returns an error
// wrapping ErrConnectionLost and the queue may or may not have been deleted;
// it is not resent.
func (c *Client) DeleteQueue(ctx context.Context, topic, group string) error {
	reply, err := c.ep.request(ctx, &protocol.DeleteQueue{Topic: topic, Group: group})
	if err != nil {
		return err
	}
	if _, ok := reply.(*protocol.OK); !ok {
		return fmt.Errorf("%w: %s in answer to DELETE_QUEUE", ErrProtocol, reply.Op())
	}
	return nil
}

// PurgeQueue discards every message of the queue topic in group that is
// queued (ready or delayed) and was published before the purge, and returns
// how many it discarded, summed over the queue's partitions, once the
// discards are durable. Purged messages are not dead-lettered. Messages
// that are inflight (delivered and not yet settled) stay with their
// consumers, whose Complete, Retry and Fail work as usual; one that is
// retried or whose lease ends while the purge is still under way may be
// purged too. A queue that does not exist is a *BrokerError with
// protocol.CodeNotFound; the queue is never created.
//
// If the connection is lost before the answer, PurgeQueue returns an error
// wrapping ErrConnectionLost and some messages may have been purged.
func (c *Client) PurgeQueue(ctx context.Context, topic, group string) (int, error) {
	reply, err := c.ep.request(ctx, &protocol.PurgeQueue{Topic: topic, Group: group})
	if err != nil {
		return 0, err
	}
	ok, isOK := reply.(*protocol.PurgeOK)
	if !isOK {
		return 0, fmt.Errorf("%w: %s in answer to PURGE_QUEUE", ErrProtocol, reply.Op())
	}
	return int(ok.Purged), nil
}
