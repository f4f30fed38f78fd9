"""What every hostile fault kind shares: the watch around it and the helpers' traces.

Development: docs/development.md, "The chaos run" (hostile participants; invariants 6 to 10).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from .cluster import ChaosCluster, Member
from .context import FaultContext
from .memory import read_memory, reset_peak
from .watch import CRASH, HostileWatch

__all__ = [
    "ASKED_BOUND",
    "asked",
    "healthy_shards",
    "log_tail",
    "ready_search_server",
    "summary",
    "wait_asked",
    "watched",
]

log = logging.getLogger(__name__)

#: Seconds a hostile peer is kept past its fault's hold until a search server has sent
#: it a request: a fault whose peer nobody asked tested nothing.
ASKED_BOUND = 20.0


def _processes(cluster: ChaosCluster) -> dict[str, asyncio.subprocess.Process]:
    return {
        member.name: member.process
        for member in [*cluster.search.values(), *cluster.data.values()]
        if member.process is not None and member.process.returncode is None
    }


def log_tail(path: Path, lines: int = 5) -> str:
    """The last ``lines`` lines of a log, on one line (at most 600 characters)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return " | ".join(text.splitlines()[-lines:])[-600:]


@contextlib.asynccontextmanager
async def watched(
    ctx: FaultContext,
    kind: str,
    *,
    allowed_missing: int | None,
    lists_equal_model: bool = False,
    redis_garbage: bool = False,
    forbidden_hits: str | None = None,
) -> AsyncIterator[HostileWatch]:
    """Run the body under a :class:`HostileWatch`; then judge memory and crashes, and
    keep the figures."""
    cluster, observer = ctx.cluster, ctx.observer
    watch = HostileWatch(
        kind,
        healthy=frozenset(observer.model & set(cluster.data)),
        allowed_missing=allowed_missing,
        lists_equal_model=lists_equal_model,
        redis_garbage=redis_garbage,
        forbidden_hits=forbidden_hits,
    )
    peaks_reset: dict[str, bool] = {}
    for member in cluster.search.values():
        process = member.process
        if process is None or process.returncode is not None:
            continue
        peaks_reset[member.name] = reset_peak(process.pid)
        memory = read_memory(process.pid)
        if memory is not None:
            watch.memory_before(member.name, process.pid, memory)
    before = _processes(cluster)
    observer.hostile = watch
    try:
        yield watch
    finally:
        observer.hostile = None
        for member in cluster.search.values():
            process = member.process
            if process is None or process.returncode is not None:
                continue
            memory = read_memory(process.pid)
            if memory is not None:
                watch.memory(
                    member.name,
                    process.pid,
                    memory,
                    peak_reset=peaks_reset.get(member.name, False),
                )
        for invariant, detail in watch.memory_verdicts():
            observer.violate(invariant, detail)
        _check_crashes(ctx, kind, before)
        figures = watch.figures()
        ctx.hostile.append(figures)
        log.info("%s: %s", kind, figures)


def _check_crashes(
    ctx: FaultContext, kind: str, before: dict[str, asyncio.subprocess.Process]
) -> None:
    """A server running when the fault began that has exited without the harness
    stopping it crashed."""
    members = {**ctx.cluster.search, **ctx.cluster.data}
    for name, process in sorted(before.items()):
        member = members[name]
        current = member.process
        if current is process and (member.stopping or member.paused):
            continue
        if current is not None and current.returncode is not None:
            ctx.observer.violate(
                CRASH,
                f"{kind}: {name} exited with status {current.returncode}: "
                f"{log_tail(member.log_path)}",
            )


def healthy_shards(ctx: FaultContext) -> list[int]:
    """Shards whose every replica is running and in the model."""
    shards: dict[int, bool] = {}
    for name, member in ctx.cluster.data.items():
        shard = int(member.extra["shard"])
        healthy = member.running and name in ctx.observer.model
        shards[shard] = shards.get(shard, True) and healthy
    return sorted(shard for shard, healthy in shards.items() if healthy)


def summary(path: Path, key: str) -> dict[str, object]:
    """The last JSON line of a helper's log that has ``key``."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        if line.startswith("{") and f'"{key}"' in line:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    return record
    return {}


async def asked(cluster: ChaosCluster, server_id: str) -> int:
    """Requests the search servers say they sent ``server_id`` (``sent`` in their
    ``/cluster`` pages; a search server that does not answer counts none)."""
    total = 0
    for member in cluster.search.values():
        view = await cluster.client.view(member)
        for server in (view or {}).get("servers") or ():
            if isinstance(server, dict) and server.get("id") == server_id:
                sent = server.get("sent")
                total += sent if isinstance(sent, int) else 0
    return total


async def wait_asked(ctx: FaultContext, server_id: str, kind: str) -> int:
    """Keep the fault until some search server has sent ``server_id`` a request, at
    most :data:`ASKED_BOUND` seconds; how many it was sent. None asked within the bound
    is counted among the run's skips (the fault tested nothing), not passed in silence."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ASKED_BOUND
    count = await asked(ctx.cluster, server_id)
    while count == 0 and loop.time() < deadline:
        await asyncio.sleep(0.5)  # a poll of the servers' pages, not synchronisation
        count = await asked(ctx.cluster, server_id)
    if count == 0:
        key = f"{kind} (never asked)"
        ctx.skipped[key] = ctx.skipped.get(key, 0) + 1
        log.warning(
            "%s: no search server sent %s a request within %gs", kind, server_id, ASKED_BOUND
        )
    return count


def ready_search_server(ctx: FaultContext, kind: str) -> Member | None:
    """A seeded pick of the running, ready search servers for ``kind`` to aim at; None
    (counted among the run's skips) when there is none."""
    cluster = ctx.cluster
    targets = sorted(n for n, m in cluster.search.items() if m.running and m.ready)
    if not targets:
        ctx.skipped[kind] = ctx.skipped.get(kind, 0) + 1
        return None
    return cluster.search[ctx.rng.choice(targets)]
