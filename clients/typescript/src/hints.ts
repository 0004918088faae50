// Partition hints (docs/protocol.md 5.6, "Partition hints"). The broker
// places a keyless publish by the hash of its producer id and sequence, so
// that a resend finds the partition that remembers it; it cannot place it by
// load, or a resend could land elsewhere and be stored twice. Its answer to a
// keyless publish names instead the partition it would choose now, the less
// loaded of two (PUBLISH_OK `next`). The client sends its next keyless
// publish to the queue to that partition, explicitly: resends keep the
// partition, so deduplication holds, and keyless publishes lean toward the
// partitions with less waiting. A publish whose hinted partition is gone
// (not_found) is sent again without it.

/** Queues whose hint a client keeps; past it the map starts over (a hint is
 * advice: without one a publish is hashed). @internal */
export const HINTS_MAX = 4096;

/** The map key of a queue: topic and group, unambiguous. @internal */
export function queueKey(topic: string, group: string): string {
  return `${topic.length}:${topic}${group}`;
}

/** The last partition hint per queue, bounded to HINTS_MAX queues. @internal */
export class PartitionHints {
  private m = new Map<string, number>();

  /** The partition to send a keyless publish of the queue to, if the broker hinted one. */
  take(queue: string): number | undefined {
    return this.m.get(queue);
  }

  /** Keeps the hint of a keyless publish's answer: next is PUBLISH_OK
   * `next` (1 + the partition; 0, absent or out of range drops the hint). */
  note(queue: string, next: unknown): void {
    if (typeof next !== "number" || !Number.isInteger(next) || next <= 0 || next > 2 ** 31 - 1) {
      this.m.delete(queue);
      return;
    }
    if (this.m.size >= HINTS_MAX && !this.m.has(queue)) this.m = new Map();
    this.m.set(queue, next - 1);
  }

  /** Forgets the hint of the queue. */
  drop(queue: string): void {
    this.m.delete(queue);
  }

  /** Queues with a hint. */
  get size(): number {
    return this.m.size;
  }
}
