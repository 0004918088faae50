"""Publishes jobs to a queue that retries each job 5 times, then moves it to
"jobs-dead".

    python3 examples/publisher.py [host:port] [count]
"""

from __future__ import annotations

import asyncio
import sys

import sinew


async def main(addr: str, count: int) -> None:
    async with await sinew.connect(addr) as client:
        await client.declare_queue("jobs", max_retries=5,
                                   dead_letter_mode=sinew.DEAD_LETTER_QUEUE,
                                   dead_letter_target="jobs-dead")
        for n in range(count):
            r = await client.publish("jobs", f"job {n}", headers=[("kind", "resize")])
            print(f"job {n} stored at partition {r.partition} offset {r.offset}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7654",
                     int(sys.argv[2]) if len(sys.argv) > 2 else 10))
