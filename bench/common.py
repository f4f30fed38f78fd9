"""What the benchmarks share: the machine record and a timestamped ``P:events`` log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import random
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from discovery.livelist.redis.layout import RedisKeys, parse_change

#: The repository: the benchmarks' child processes run from it.
ROOT = Path(__file__).resolve().parent.parent


async def spawn_python(
    procs: list[asyncio.subprocess.Process], *argv: str
) -> asyncio.subprocess.Process:
    """Start ``python *argv`` in the repository (stdin closed) and add it to ``procs``,
    the list a benchmark stops with ``terminate_all`` at the end."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, *argv, stdin=asyncio.subprocess.DEVNULL, cwd=ROOT
    )
    procs.append(process)
    return process


def write_results(path: Path, benchmark: str, parameters: dict[str, Any], **fields: Any) -> None:
    """Write one benchmark's JSON: its name, the command that ran it, its parameters, the
    machine, then ``fields`` (notes, rows, ...) in the order given; print where."""
    record = {
        "benchmark": benchmark,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "parameters": parameters,
        "machine": machine(),
        **fields,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}", flush=True)


def machine() -> dict[str, Any]:
    """CPU count, Python, platform, load average and the CPU steal since this benchmark
    started (imported this module), for a result's JSON."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": os.getloadavg(),
        "cpu_steal_share": _RUN.steal_share(),
    }


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port_block(count: int, taken: set[int]) -> int:
    """A free block of ports below the ephemeral range (as ``discovery demo`` does)."""
    low, high = 20_000, _ephemeral_low() - count
    for _ in range(200):
        base = random.randrange(low, max(low + 1, high))
        block = set(range(base, base + count))
        if block & taken:
            continue
        ok = True
        for port in block:
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            taken |= block
            return base
    raise RuntimeError(f"no block of {count} free ports")


def cpu_jiffies() -> tuple[int, int]:
    """(steal, total) CPU time of this machine in jiffies, from ``/proc/stat``.

    Steal is time the hypervisor ran something else while this VM wanted the CPU: on a
    shared host under sustained load it comes in bursts that stall every process at
    once, and benchmarks record it so that such stalls are not taken for our latency.
    """
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0, 0
    values = [int(v) for v in fields[:8]]
    return values[7], sum(values)


class CpuMeter:
    """Steal share of the machine's CPU time since creation (or :meth:`reset`)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._start = cpu_jiffies()

    def steal_share(self) -> float:
        steal, total = cpu_jiffies()
        elapsed = total - self._start[1]
        return round((steal - self._start[0]) / elapsed, 4) if elapsed > 0 else 0.0


def nearest_rank(values: list[float], q: float) -> float:
    """The nearest-rank percentile (with 20 values, p99 is the largest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary_ms(values_ms: list[float]) -> dict[str, float]:
    """p50 / p99 (nearest rank) / max / min / mean of millisecond figures."""
    return {
        "p50_ms": round(statistics.median(values_ms), 1),
        "p99_ms": round(nearest_rank(values_ms, 0.99), 1),
        "max_ms": round(max(values_ms), 1),
        "min_ms": round(min(values_ms), 1),
        "mean_ms": round(statistics.fmean(values_ms), 1),
    }


class EventLog:
    """Every ``P:changes`` entry with its arrival time (``clock``), followed with XREAD.

    Each entry is given as a dict in the shape of layout 1's events, so the benchmarks
    match on it unchanged: ``epoch``, ``version``, ``leader``, ``published_at``,
    ``full``, ``added`` and ``changed`` (both: the entry's upserts, which layout 2 does
    not split) and ``removed`` (``[{"id", "reason"}]``).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        timeout: float = 30.0,
    ) -> None:
        self._redis = redis
        self._stream = RedisKeys(prefix).changes
        self._clock = clock
        self._timeout = timeout
        self.events: list[tuple[float, dict[str, Any]]] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        last = await self._redis.xrevrange(self._stream, count=1)
        self._task = asyncio.create_task(
            self._read(last[0][0] if last else "0-0"), name="bench:events"
        )

    async def _read(self, last: Any) -> None:
        while True:
            reply = await self._redis.xread({self._stream: last}, block=1000)
            arrived = self._clock()
            for _name, entries in reply or []:
                for stream_id, fields in entries:
                    last = stream_id
                    entry = parse_change(stream_id, fields)
                    upserts = [i.to_dict() for i in entry.upserts]
                    self.events.append(
                        (
                            arrived,
                            {
                                "epoch": entry.epoch,
                                "version": entry.version,
                                "leader": entry.leader,
                                "published_at": entry.published_at,
                                "full": entry.full,
                                "added": upserts,
                                "changed": upserts,
                                "removed": [{"id": i, "reason": r} for i, r in entry.removes],
                            },
                        )
                    )
                    self._arrived.set()

    async def wait_for(
        self,
        match: Callable[[dict[str, Any]], bool],
        start: int = 0,
        timeout: float | None = None,
    ) -> tuple[float, dict[str, Any]]:
        """The first event at index >= ``start`` that matches (arrival time, event)."""
        async with asyncio.timeout(self._timeout if timeout is None else timeout):
            index = start
            while True:
                while index < len(self.events):
                    arrived, event = self.events[index]
                    if match(event):
                        return arrived, event
                    index += 1
                self._arrived.clear()
                await self._arrived.wait()

    def max_epoch(self) -> int:
        return max((e["epoch"] for _, e in self.events), default=0)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


# The whole run of the benchmark that imports this module (see machine()).
_RUN = CpuMeter()


def quick_defaults(args: Any, quick: bool, **defaults: tuple[Any, Any]) -> None:
    """Fill each option of ``args`` left at ``None`` with its ``(full, quick)`` default."""
    for name, (full, small) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)


CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (``None`` once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


def process_tree() -> dict[int, list[int]]:
    """Every process's children, by parent pid, from ``/proc``."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(root: int, tree: dict[int, list[int]]) -> list[int]:
    """``root`` and every process below it in ``tree`` (:func:`process_tree`)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(tree.get(pid, []))
    return out
