"""A worker: completes jobs that succeed, retries failures with a growing
delay (the broker dead-letters a job after its last retry), and fails jobs
that can never succeed, which dead-letters them at once. A second task reads
the dead letters.

    python3 examples/worker.py [host:port]
"""

from __future__ import annotations

import asyncio
import sys

import sinew


class Permanent(Exception):
    """A job that can never succeed."""


async def handle(msg: sinew.Message) -> None:
    if "bad" in msg.text:
        raise Permanent(msg.text)
    if "flaky" in msg.text and msg.attempt < 3:
        raise RuntimeError("try again")


async def work(client: sinew.Client, done: asyncio.Event | None = None) -> None:
    sub = await client.subscribe("jobs", prefetch=16)
    async for msg in sub:
        try:
            await handle(msg)
        except Permanent:
            await msg.fail()  # dead-lettered at once, reason "failed"
        except Exception:
            # Wait a little longer on every attempt; after max_retries the
            # broker dead-letters the job with reason "retries_exhausted".
            await msg.retry_after(10 * msg.attempt)
        else:
            await msg.complete()
            print(f"done: {msg.text} (attempt {msg.attempt})")


async def dead_letters(client: sinew.Client) -> None:
    async for msg in await client.subscribe("jobs-dead"):
        print(f"dead: {msg.text} reason={msg.header('sinew.reason')} retries={msg.header('sinew.retries')}")
        await msg.complete()


async def main(addr: str) -> None:
    async with await sinew.connect(addr) as client:
        await asyncio.gather(work(client), dead_letters(client))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7654"))
