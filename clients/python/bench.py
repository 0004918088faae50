"""Throughput of the Python client against a running broker, for comparison
with `sinew bench` (the Go SDK).

    python3 bench.py publish --addr 127.0.0.1:7654 --window 64 --duration 5
    python3 bench.py drain --addr 127.0.0.1:7654 --count 50000 --prefetch 256

publish keeps --window publishes in flight, each waiting for its confirm, for
--duration seconds (after a 1 s warm-up). drain prefills --count messages,
then consumes and completes them, with up to --prefetch settles in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sinew  # noqa: E402


async def publish(a: argparse.Namespace) -> None:
    body = os.urandom(a.size)
    lat: list[float] = []
    count = 0
    measuring = False
    stop = False
    async with await sinew.connect(a.addr) as c:
        async def worker() -> None:
            nonlocal count
            while not stop:
                t0 = time.perf_counter()
                await c.publish(a.topic, body)
                if measuring:
                    lat.append(time.perf_counter() - t0)
                    count += 1

        tasks = [asyncio.create_task(worker()) for _ in range(a.window)]
        await asyncio.sleep(1.0)  # warm-up
        measuring = True
        t0 = time.perf_counter()
        await asyncio.sleep(a.duration)
        measuring = False
        el = time.perf_counter() - t0
        stop = True
        await asyncio.gather(*tasks)
    lat.sort()
    print(f"publish window={a.window} size={a.size}: {count / el:,.0f} msg/s, "
          f"p50 {statistics.median(lat) * 1000:.3f} ms, p99 {lat[int(len(lat) * 0.99)] * 1000:.3f} ms, "
          f"{count} msgs in {el:.2f} s")


async def drain(a: argparse.Namespace) -> None:
    body = os.urandom(a.size)
    async with await sinew.connect(a.addr) as c:
        sem = asyncio.Semaphore(256)

        async def one() -> None:
            async with sem:
                await c.publish(a.topic, body)

        await asyncio.gather(*(one() for _ in range(a.count)))
        sub = await c.subscribe(a.topic, prefetch=a.prefetch)
        t0 = time.perf_counter()
        pending: set[asyncio.Task[None]] = set()
        n = 0
        async for m in sub:
            t = asyncio.create_task(m.complete())
            pending.add(t)
            t.add_done_callback(pending.discard)
            n += 1
            if n == a.count:
                break
        await asyncio.gather(*pending)
        el = time.perf_counter() - t0
    print(f"drain count={a.count} prefetch={a.prefetch} size={a.size}: {a.count / el:,.0f} msg/s in {el:.2f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["publish", "drain"])
    p.add_argument("--addr", default="127.0.0.1:7654")
    p.add_argument("--topic", default="")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--count", type=int, default=50_000)
    p.add_argument("--prefetch", type=int, default=256)
    p.add_argument("--size", type=int, default=1024)
    a = p.parse_args()
    a.topic = a.topic or f"pybench-{a.mode}-{os.getpid()}"
    asyncio.run(publish(a) if a.mode == "publish" else drain(a))


if __name__ == "__main__":
    main()
