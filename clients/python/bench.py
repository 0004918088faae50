"""Throughput of the Python client against a running broker, beside the Go SDK
(`sinew bench`) on the same broker in the same run.

    python3 bench.py publish --addr 127.0.0.1:7654 --window 64 --duration 5
    python3 bench.py drain --addr 127.0.0.1:7654 --count 50000 --prefetch 1000
    python3 bench.py compare --addr 127.0.0.1:7654 --sinew ./sinew --rounds 3

publish keeps --window publishes in flight, each waiting for its confirm, for
--duration seconds (after a 1 s warm-up). drain prefills --count messages,
then consumes them with the worker loop of the README::

    async for msg in sub:
        await msg.complete()   # a fast settle: returns once queued

compare runs `sinew bench publish` and `sinew bench drain` (the Go SDK) and
the two workloads above in turns, --rounds times, with the same settings,
and prints each figure, the medians and the Python/Go ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sinew  # noqa: E402


async def publish(addr: str, topic: str, window: int, duration: float, size: int) -> float:
    body = os.urandom(size)
    lat: list[float] = []
    count = 0
    measuring = False
    stop = False
    async with await sinew.connect(addr) as c:
        async def worker() -> None:
            nonlocal count
            while not stop:
                t0 = time.perf_counter()
                await c.publish(topic, body)
                if measuring:
                    lat.append(time.perf_counter() - t0)
                    count += 1

        tasks = [asyncio.create_task(worker()) for _ in range(window)]
        await asyncio.sleep(1.0)  # warm-up
        measuring = True
        t0 = time.perf_counter()
        await asyncio.sleep(duration)
        measuring = False
        el = time.perf_counter() - t0
        stop = True
        await asyncio.gather(*tasks)
        await c.delete_queue(topic)  # as `sinew bench` deletes its fresh queue
    lat.sort()
    rate = count / el
    print(f"python publish window={window} size={size}: {rate:,.0f} msg/s, "
          f"p50 {statistics.median(lat) * 1000:.3f} ms, p99 {lat[int(len(lat) * 0.99)] * 1000:.3f} ms, "
          f"{count} msgs in {el:.2f} s", flush=True)
    return rate


async def drain(addr: str, topic: str, count: int, prefetch: int, size: int) -> float:
    body = os.urandom(size)
    async with await sinew.connect(addr) as c:
        left = count

        async def prefill() -> None:  # 256 in flight, as `sinew bench drain` prefills
            nonlocal left
            while left > 0:
                left -= 1
                await c.publish(topic, body)

        await asyncio.gather(*(prefill() for _ in range(256)))
        t0 = time.perf_counter()
        n = 0
        async with await c.subscribe(topic, prefetch=prefetch) as sub:
            async for msg in sub:  # the README's worker loop
                await msg.complete()
                n += 1
                if n == count:
                    break
        el = time.perf_counter() - t0  # the last settles are flushed by leaving `async with sub`
        await c.delete_queue(topic)
    rate = count / el
    print(f"python drain count={count} prefetch={prefetch} size={size}: {rate:,.0f} msg/s in {el:.2f} s", flush=True)
    return rate


def go_bench(binary: str, mode: str, a: argparse.Namespace) -> float:
    if mode == "publish":
        args = ["publish", "--window", str(a.window), "--duration", f"{a.duration}s", "--warmup", "1s"]
    else:
        args = ["drain", "--count", str(a.count), "--prefetch", str(a.prefetch)]
    # A fresh queue per run, deleted at its end.
    cmd = [binary, "bench", *args, "--addr", a.addr, "--size", str(a.size), "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    doc = json.loads(out)
    rate = float(doc["msg_per_sec"])
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"go     {mode}: {rate:,.0f} msg/s, {cpu / doc['messages'] * 1e6:.1f} us CPU per message measured "
          f"(whole process)  ({' '.join(cmd[1:])})", flush=True)
    CPU[f"go {mode}"].append(cpu / doc["messages"] * 1e6)
    return rate


CPU: dict[str, list[float]] = {"go publish": [], "python publish": [], "go drain": [], "python drain": []}


def cpu_now() -> float:
    return time.process_time()


def compare(a: argparse.Namespace) -> None:
    res: dict[str, list[float]] = {"go publish": [], "python publish": [], "go drain": [], "python drain": []}
    for r in range(a.rounds):
        tag = f"{os.getpid()}-{r}"
        res["go publish"].append(go_bench(a.sinew, "publish", a))
        c0 = cpu_now()
        res["python publish"].append(asyncio.run(publish(a.addr, f"pybench-pub-{tag}", a.window, a.duration, a.size)))
        CPU["python publish"].append((cpu_now() - c0) / (res["python publish"][-1] * a.duration) * 1e6)
        res["go drain"].append(go_bench(a.sinew, "drain", a))
        c0 = cpu_now()
        res["python drain"].append(asyncio.run(drain(a.addr, f"pybench-drain-{tag}", a.count, a.prefetch, a.size)))
        CPU["python drain"].append((cpu_now() - c0) / a.count * 1e6)
    med = {k: statistics.median(v) for k, v in res.items()}
    for k, v in res.items():
        print(f"{k:15s} " + " / ".join(f"{x:,.0f}" for x in v) + f"  median {med[k]:,.0f} msg/s")
    for k, v in CPU.items():
        print(f"{k:15s} CPU per measured message, whole run: " + " / ".join(f"{x:.1f}" for x in v) + " us")
    print(f"ratio publish python/go {med['python publish'] / med['go publish']:.2f} (goal >= 0.7)")
    print(f"ratio drain   python/go {med['python drain'] / med['go drain']:.2f} (goal >= 0.5)")
    print(f"load average {os.getloadavg()[0]:.1f} at the end on {os.cpu_count()} CPUs")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["publish", "drain", "compare"])
    p.add_argument("--addr", default="127.0.0.1:7654")
    p.add_argument("--topic", default="")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--count", type=int, default=50_000)
    p.add_argument("--prefetch", type=int, default=1000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--sinew", default="sinew", help="the sinew binary whose `bench` is the Go SDK's (compare)")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    topic = a.topic or f"pybench-{a.mode}-{os.getpid()}"
    if a.mode == "publish":
        asyncio.run(publish(a.addr, topic, a.window, a.duration, a.size))
    elif a.mode == "drain":
        asyncio.run(drain(a.addr, topic, a.count, a.prefetch, a.size))
    else:
        compare(a)


if __name__ == "__main__":
    main()
