"""The README's examples (examples/*.py) run against a real broker and do
what the README says."""

from __future__ import annotations

import asyncio
import contextlib
import io
import sys
import unittest
from pathlib import Path

import sinew

from harness import Broker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import publisher  # noqa: E402
import worker  # noqa: E402

WAIT_S = 15.0


class Examples(unittest.IsolatedAsyncioTestCase):
    async def test_publisher_and_worker(self) -> None:
        b = Broker()
        await b.start()
        self.addAsyncCleanup(b.close)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            await publisher.main(b.addr, 3)
        self.assertEqual(len(out.getvalue().splitlines()), 3)
        async with await sinew.connect(b.addr) as c:
            for body in ("flaky job", "bad job"):
                await c.publish("jobs", body)
        lines: list[str] = []

        class Tee(io.StringIO):
            def write(self, s: str) -> int:
                lines.extend(x for x in s.splitlines() if x)
                return len(s)

        async with await sinew.connect(b.addr) as c:
            tasks = [asyncio.create_task(worker.work(c)), asyncio.create_task(worker.dead_letters(c))]
            with contextlib.redirect_stdout(Tee()):
                async def five() -> None:
                    while len(lines) < 5:
                        await asyncio.sleep(0.01)
                await asyncio.wait_for(five(), WAIT_S)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.assertCountEqual(lines, [
            "done: job 0 (attempt 1)", "done: job 1 (attempt 1)", "done: job 2 (attempt 1)",
            "done: flaky job (attempt 3)", "dead: bad job reason=failed retries=1"])


if __name__ == "__main__":
    unittest.main()
