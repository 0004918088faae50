"""Test harness: a real `sinew serve` child process and a loopback fault proxy.

The broker binary is built once per test run with `go build ./cmd/sinew` into
a temporary directory (or taken from $SINEW_BIN when set).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
_bin_lock = threading.Lock()
_bin_path: str | None = None
_bin_dir: tempfile.TemporaryDirectory[str] | None = None

START_TIMEOUT_S = 30.0  # a broker that has not logged "serving" by then failed
STOP_TIMEOUT_S = 30.0  # bound on a drain at SIGTERM


def broker_binary() -> str:
    """Builds the broker once and returns its path."""
    global _bin_path, _bin_dir
    with _bin_lock:
        if _bin_path:
            return _bin_path
        env = os.environ.get("SINEW_BIN")
        if env:
            _bin_path = env
            return env
        _bin_dir = tempfile.TemporaryDirectory(prefix="sinew-pytest-bin-")
        out = os.path.join(_bin_dir.name, "sinew")
        go = shutil.which("go") or "/usr/local/go/bin/go"
        subprocess.run([go, "build", "-o", out, "./cmd/sinew"], cwd=REPO, check=True)
        _bin_path = out
        return out


class Broker:
    """A `sinew serve` child process on a loopback port chosen by the kernel."""

    def __init__(self, *args: str, grace_ms: int = 30_000, drain_timeout_ms: int = 5_000) -> None:
        self.data = tempfile.TemporaryDirectory(prefix="sinew-pytest-data-")
        self.extra = list(args)
        self.grace_ms = grace_ms
        self.drain_timeout_ms = drain_timeout_ms
        self.addr = "127.0.0.1:0"
        self.proc: asyncio.subprocess.Process | None = None
        self.log: list[str] = []
        self._pump: asyncio.Task[None] | None = None

    async def start(self) -> str:
        """Starts (or restarts, on the same port and data) the broker."""
        binary = await asyncio.to_thread(broker_binary)  # a build must not stall the event loop
        self.proc = await asyncio.create_subprocess_exec(
            binary, "serve", "--listen", self.addr, "--admin-listen", "",
            "--data-dir", self.data.name,
            "--runtime-seed-connection-reconnect-grace-ms", str(self.grace_ms),
            "--runtime-seed-connection-drain-timeout-ms", str(self.drain_timeout_ms), *self.extra,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert self.proc.stderr is not None
        stderr = self.proc.stderr

        async def first_serving() -> str:
            while True:
                line = (await stderr.readline()).decode(errors="replace")
                if not line:
                    raise RuntimeError("broker exited:\n" + "".join(self.log[-20:]))
                self.log.append(line)
                m = re.search(r'msg=serving listen=(\S+)', line)
                if m:
                    return m.group(1)

        self.addr = await asyncio.wait_for(first_serving(), START_TIMEOUT_S)

        async def pump() -> None:  # keep reading so the child never blocks on a full pipe
            while line := await stderr.readline():
                self.log.append(line.decode(errors="replace"))

        self._pump = asyncio.create_task(pump())
        return self.addr

    async def stop(self) -> int:
        """SIGTERM: the broker drains (GOING_AWAY) and exits."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(self.proc.wait(), STOP_TIMEOUT_S)
        if self._pump:
            await self._pump
        return rc

    async def kill(self) -> None:
        """SIGKILL, for cleanup."""
        if self.proc and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self._pump:
            self._pump.cancel()

    async def close(self) -> None:
        await self.kill()
        self.data.cleanup()


class FaultProxy:
    """A TCP proxy on loopback between the client and the broker.

    cut_all() aborts every proxied connection in both directions at once (the
    client sees a reset, the broker a dropped peer). refuse(True) closes the
    listener so connects are refused; refuse(False) listens again on the same
    port. hold(True) stops passing what the broker sends (it waits in the
    proxy and the sockets' buffers) until hold(False): the client's requests
    still reach the broker, their answers do not reach the client.
    """

    def __init__(self, target: str) -> None:
        self.target = target
        self.port = 0
        self.server: asyncio.base_events.Server | None = None
        self.pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.accepted = 0
        self.flowing = asyncio.Event()  # broker-to-client bytes pass while set
        self.flowing.set()

    def hold(self, on: bool) -> None:
        if on:
            self.flowing.clear()
        else:
            self.flowing.set()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.addr

    async def refuse(self, on: bool) -> None:
        if on and self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        elif not on and self.server is None:
            await self.start()

    def cut_all(self) -> None:
        for a, b in list(self.pairs):
            a.transport.abort()
            b.transport.abort()
        self.pairs.clear()

    async def close(self) -> None:
        await self.refuse(True)
        self.cut_all()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.accepted += 1
        host, _, port = self.target.rpartition(":")
        try:
            br, bw = await asyncio.open_connection(host, int(port))
        except OSError:
            cw.transport.abort()
            return
        pair = (cw, bw)
        self.pairs.add(pair)

        async def pipe(r: asyncio.StreamReader, wr: asyncio.StreamWriter, gate: asyncio.Event | None) -> None:
            try:
                while data := await r.read(65536):
                    if gate is not None:
                        await gate.wait()
                    wr.write(data)
                    await wr.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                wr.transport.abort() if pair not in self.pairs else wr.close()

        await asyncio.gather(pipe(cr, bw, None), pipe(br, cw, self.flowing))
        self.pairs.discard(pair)
