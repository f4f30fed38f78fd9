"""The hostile fault kinds: one bad participant in a healthy cluster costs only itself.

Each kind runs under a :class:`~.watch.HostileWatch` and adds checks of its own.

Development: docs/development.md, "The chaos run" (hostile participants; invariants 6 to 10).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import redis as sync_redis

from discovery.config import ZkConfig
from discovery.errors import DiscoveryError
from discovery.instance import InstancePayload, InstanceState, ServiceInstance
from discovery.livelist.redis.layout import RedisKeys
from discovery.testing.ports import LOOPBACK, free_ports
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.session import ZkSession

from .cluster import DATA_DOCS, ChaosCluster, Member
from .context import START_BOUND, FaultContext, redis_bound
from .hostile_common import (
    healthy_shards,
    log_tail,
    ready_search_server,
    summary,
    wait_asked,
    watched,
)
from .hostile_peer import HUGE_ID
from .hostile_reach import hostile_idle_flood, hostile_loopback_target, hostile_phantom_shard
from .watch import (
    SKIPPED,
    STORM,
    STORM_MIN_COMPLETE,
)

__all__ = ["HOSTILE_FAULTS", "HOSTILE_KINDS", "HostileNode", "hostile_registrations"]

log = logging.getLogger(__name__)

#: The storm's clients and query, as issue 21 measured them.
STORM_CLIENTS = 4
STORM_TERMS = 150
#: How long our own watcher and the leader may take to see a hostile node.
SEEN_BOUND = 3.0
_SKIPPED_METRIC = "discovery_membership_skipped_total"
_REFUSED_METRIC = "search_server_query_of_death_refused_total"


# -- malformed registrations -------------------------------------------------------------


@dataclass(frozen=True)
class HostileNode:
    """One child a hostile registration writes: its name, its first data, the data it
    is rewritten with midway (None: left as it is), and whether it is persistent (every
    other is ephemeral, owned by our raw session)."""

    child: str
    data: bytes
    rewrite: bytes | None = None
    persistent: bool = False


def _document(child: str, address: str, listen: int, **changes: object) -> bytes:
    """A registration document for ``child`` as the contract has it, then with
    ``address`` and ``changes`` (JSON names) put in whatever they are."""
    instance = ServiceInstance.create(
        "data_servers",
        child,
        LOOPBACK,
        listen,
        InstancePayload(
            shard=0, replica=97, docs=1, version="hostile", state=InstanceState.SERVING
        ),
    )
    document = {**instance.to_dict(), "address": address, **changes}
    return json.dumps(document, ensure_ascii=False).encode("utf-8")


def hostile_registrations(tag: str, *, impersonate: str, port: int) -> list[HostileNode]:
    """The malformed children of one ``hostile_registration`` fault (names carry ``tag``).

    Bad JSON, an address that is not ASCII, a 70-character label, a link-local
    address (each rewritten midway as the next of these four, so that a changed child
    is judged again), a persistent node whose document says ``DYNAMIC``, one whose
    document says ``STATIC`` (Curator's persistent kind, refused unless a reader is told
    to allow persistent members), and a node
    whose document claims the id ``impersonate`` of a real data server (rewritten as
    that server draining). ``port``: where the valid-looking ones point (nothing
    listens there)."""
    base = f"hostile-{tag}"

    def variants(child: str) -> list[bytes]:
        return [
            b'{"name":"data_servers","id":"' + child.encode("ascii") + b'","address":',
            _document(child, "d\u00e4t\u00e4.example", port),
            _document(child, "a" * 70 + ".example", port),
            _document(child, "169.254.169.254", port),
        ]

    nodes = []
    for index, name in enumerate(("json", "unicode", "label", "linklocal")):
        child = f"{base}-{name}"
        bad = variants(child)
        nodes.append(HostileNode(child, bad[index], rewrite=bad[(index + 1) % len(bad)]))
    nodes.append(
        HostileNode(
            f"{base}-persistent", _document(f"{base}-persistent", LOOPBACK, port), persistent=True
        )
    )
    static = f"{base}-static"
    nodes.append(
        HostileNode(
            static,
            _document(static, LOOPBACK, port, serviceType="STATIC"),
            persistent=True,
        )
    )
    draining = {"shard": 0, "replica": 0, "docs": 1, "version": "x", "state": "draining"}
    nodes.append(
        HostileNode(
            f"{base}-impostor",
            _document(impersonate, LOOPBACK, port),
            rewrite=_document(impersonate, LOOPBACK, port, payload=draining),
        )
    )
    return nodes


def _skipped_total(samples: dict[str, float] | None) -> float | None:
    if samples is None:
        return None
    return sum(v for k, v in samples.items() if k.startswith(_SKIPPED_METRIC + "{"))


async def hostile_registration(ctx: FaultContext) -> None:
    """Malformed registrations under ``/data_servers`` from a raw session for a while."""
    kind = "hostile_registration"
    cluster, observer = ctx.cluster, ctx.observer
    victims = sorted(name for name in observer.model if name in cluster.data)
    impersonated = ctx.rng.choice(victims)
    tag = f"{ctx.rng.randrange(16**6):06x}"
    (port,) = free_ports(1)
    nodes = hostile_registrations(tag, impersonate=impersonated, port=port)
    children = frozenset(node.child for node in nodes)
    leader = await cluster.leader()
    counted_before = _skipped_total(await cluster.metrics(leader)) if leader else None
    session = ZkSession.from_config(
        ZkConfig(cluster.zk_hosts, session_timeout=ctx.config.session_timeout)
    )
    writes = 0
    async with watched(ctx, kind, allowed_missing=0, lists_equal_model=True) as watch:
        try:
            await session.start()
            for node in nodes:
                await session.create(
                    f"{DATA_SERVERS_PATH}/{node.child}", node.data, ephemeral=not node.persistent
                )
                writes += 1
            log.info("%s: wrote %d malformed children (impostor of %s)", kind, writes, impersonated)
            await ctx.converge(
                kind,
                "skipped by every reader",
                SEEN_BOUND,
                lambda s: children <= set(observer.invalid_children),
            )
            await ctx.hold(1.0, 2.5)
            for node in nodes:
                if node.rewrite is not None:
                    await session.set(f"{DATA_SERVERS_PATH}/{node.child}", node.rewrite)
                    writes += 1
            await ctx.hold(1.0, 2.5)
        except DiscoveryError as exc:
            observer.violate("fault injected", f"{kind}: {exc}")
        finally:
            with contextlib.suppress(DiscoveryError):
                for node in nodes:
                    if node.persistent:
                        await session.delete(f"{DATA_SERVERS_PATH}/{node.child}")
            await session.aclose()  # the ephemeral ones go with the session
        await ctx.converge(
            kind,
            "hostile children gone",
            SEEN_BOUND,
            lambda s: not children & set(observer.invalid_children),
        )
        counted_after = _skipped_total(await cluster.metrics(leader)) if leader else None
        if counted_before is None or counted_after is None:
            ctx.skipped[kind + " (skip count)"] = ctx.skipped.get(kind + " (skip count)", 0) + 1
        else:
            counted = counted_after - counted_before
            watch.notes.update(children=len(nodes), writes=writes, leader_skipped=counted)
            if counted < len(nodes):
                observer.violate(
                    SKIPPED,
                    f"{kind}: the leader {leader.name if leader else '?'} counted "
                    f"{counted:g} skipped children for {len(nodes)} malformed ones",
                )


# -- hostile peers --------------------------------------------------------------------


def _hostile_peer(mode: str) -> Callable[[FaultContext], Awaitable[None]]:
    kind = {"endless": "hostile_endless_body", "huge": "hostile_huge_answer"}.get(
        mode, f"hostile_{mode}"
    )
    # A huge answer is valid: the hits it would put on top are the violation to watch for.
    forbidden = HUGE_ID if mode == "huge" else None

    async def run(ctx: FaultContext) -> None:
        cluster, observer = ctx.cluster, ctx.observer
        shards = healthy_shards(ctx)
        if not shards:
            ctx.skipped[kind] = ctx.skipped.get(kind, 0) + 1
            log.warning("%s skipped: no shard with every replica healthy", kind)
            return
        shard = ctx.rng.choice(shards)
        name = f"hostile-{mode}-{ctx.rng.randrange(16**6):06x}"
        (port,) = free_ports(1)
        host = cluster.lab.gateway if cluster.lab is not None else LOOPBACK
        argv = [
            *("-m", "discovery.tools.chaos.hostile_peer", "--mode", mode),
            *("--zk", cluster.zk_hosts, "--id", name, "--shard", str(shard)),
            *("--host", host, "--port", str(port)),
            *("--session-timeout", str(ctx.config.session_timeout)),
            *("--seed", str(ctx.rng.randrange(2**32))),
        ]
        async with watched(ctx, kind, allowed_missing=1, forbidden_hits=forbidden) as watch:
            log.info("%s: %s answers for shard %d at %s:%d", kind, name, shard, host, port)
            await cluster.spawn_helper(name, argv)
            observer.model.add(name)
            try:
                await ctx.converge(kind, "hostile peer listed", START_BOUND)
                await ctx.hold(4.0, 8.0)
                watch.notes["asked"] = await wait_asked(ctx, name, kind)
            finally:
                status = await cluster.stop_helper(name)
                observer.model.discard(name)
            await ctx.converge(kind, "hostile peer gone", ctx.config.crash_bound)
            counts = summary(cluster.helper_log(name), "hostile_peer")
            watch.notes.update(
                shard=shard,
                requests=counts.get("requests"),
                bytes_sent=counts.get("bytes_sent"),
            )
            if status not in (0, None):
                observer.violate(
                    "fault injected",
                    f"{kind}: the hostile peer exited {status}: "
                    f"{log_tail(cluster.helper_log(name))}",
                )

    run.__name__ = kind
    run.__doc__ = f"A registered replica of one healthy shard that answers in mode {mode!r}."
    return run


# -- a storm of queries of death --------------------------------------------------------

_TOTALS = re.compile(r"(\w+)=(\d+)\b")


def storm_totals(path: Path) -> dict[str, int]:
    """The storm's outcomes from its last ``total`` line (``ok=.. refused=..``)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        if line.startswith("total "):
            return {k: int(v) for k, v in _TOTALS.findall(line)}
    return {}


async def hostile_query_storm(ctx: FaultContext) -> None:
    """4 clients send a shard's 150 most frequent terms back to back through one search
    server, while the normal load goes on."""
    kind = "hostile_query_storm"
    cluster, observer = ctx.cluster, ctx.observer
    target = ready_search_server(ctx, kind)
    if target is None:
        return
    shard = ctx.rng.randrange(ctx.config.shards)
    seconds = round(ctx.rng.uniform(8.0, 12.0), 1)
    name = f"storm-{ctx.rng.randrange(16**6):06x}"
    argv = [
        *("-m", "data_server.cli", "loadgen", "--worst-case"),
        *("--clients", str(STORM_CLIENTS), "--terms", str(STORM_TERMS)),
        *("--docs", str(DATA_DOCS), "--shard", str(shard)),
        *("--target", target.url, "--timeout-ms", str(ctx.config.deadline_ms)),
        *("--duration", str(seconds), "--report-interval", "1000"),
    ]
    refused_before = (await cluster.metrics(target) or {}).get(_REFUSED_METRIC)
    async with watched(ctx, kind, allowed_missing=None) as watch:
        log.info("%s: %gs of shard %d's worst query through %s", kind, seconds, shard, target.name)
        started = time.monotonic()
        process = await cluster.spawn_helper(name, argv)
        try:
            async with asyncio.timeout(seconds + 30.0):
                await process.wait()
        except TimeoutError:
            observer.violate("fault injected", f"{kind}: the storm did not stop")
        finally:
            await cluster.stop_helper(name)
        ended = time.monotonic()
        for through, label in ((target.name, f"through {target.name}"), (None, "in all")):
            complete, total = watch.completion(through, started, ended)
            short = watch.shortfall(through, started, ended)
            watch.notes[f"normal_complete {label}"] = f"{complete}/{total}"
            if short:
                watch.notes[f"normal_incomplete {label}"] = short
            if total and complete < STORM_MIN_COMPLETE * total:
                observer.violate(
                    STORM,
                    f"{kind}: {complete} of {total} normal queries {label} complete "
                    f"({complete / total * 100:.0f} %) during {seconds:g} s of the storm; "
                    f"the others: {short}",
                )
        refused_after = (await cluster.metrics(target) or {}).get(_REFUSED_METRIC)
        totals = storm_totals(cluster.helper_log(name))
        watch.notes.update(target=target.name, shard=shard, storm=totals)
        if refused_before is not None and refused_after is not None:
            watch.notes["refused_by_guard"] = int(refused_after - refused_before)
        if process.returncode not in (0, None) and not totals:
            observer.violate(
                "fault injected",
                f"{kind}: the storm exited {process.returncode}: "
                f"{log_tail(cluster.helper_log(name))}",
            )
        await ctx.converge(kind, "after the storm", 1.0)


# -- malformed Redis contents ---------------------------------------------------------

#: Malformed numbers of ``P:meta``, one per write: (field, value).
META_GARBAGE = (
    ("epoch", "9" * 5000),
    ("version", "not-a-number"),
    ("count", "1e999"),
)


def _hset(cluster: ChaosCluster, key: str, fields: Mapping[str, bytes]) -> None:
    """Write ``fields`` into the hash ``key`` on the Redis primary (blocking: a thread)."""
    with cluster.primary_client() as client:
        for field, value in fields.items():
            client.hset(key, field, value)


def hostile_fields(tag: str, port: int) -> dict[str, bytes]:
    """Fields for ``P:servers`` that no reader may route to: bad JSON, and a valid-looking
    instance whose address is not ASCII."""
    bad_json = f"hostile-{tag}-json"
    unicode = f"hostile-{tag}-unicode"
    return {
        bad_json: b'{"name":"data_servers","id":"' + bad_json.encode("ascii") + b'",',
        unicode: _document(unicode, "d\u00e4t\u00e4.example", port),
    }


async def hostile_redis_entry(ctx: FaultContext) -> None:
    """Malformed ``P:servers`` fields (a reader restarted over them), then malformed
    ``P:meta`` numbers one at a time, each healed by the leader."""
    kind = "hostile_redis_entry"
    cluster, observer = ctx.cluster, ctx.observer
    keys = RedisKeys(cluster.redis_prefix)
    (port,) = free_ports(1)
    fields = hostile_fields(f"{ctx.rng.randrange(16**6):06x}", port)
    bound = redis_bound(ctx.config)
    leader = await cluster.leader()
    followers = sorted(
        n for n, m in cluster.search.items() if m.running and not m.paused and m is not leader
    )
    restarted: Member | None = (
        cluster.search[ctx.rng.choice(followers)] if leader is not None and followers else None
    )
    order = ctx.rng.sample(META_GARBAGE, len(META_GARBAGE))
    async with watched(
        ctx, kind, allowed_missing=0, lists_equal_model=True, redis_garbage=True
    ) as watch:
        try:
            await asyncio.to_thread(_hset, cluster, keys.servers, fields)
        except (sync_redis.RedisError, OSError) as exc:
            observer.violate("fault injected", f"{kind}: cannot write {keys.servers}: {exc}")
            return
        if restarted is not None:
            reader = restarted.name
            log.info("%s: garbage in %s; restarting %s over it", kind, keys.servers, reader)
            await cluster.restart(restarted)
            await ctx.converge(
                kind, "reader restarted over garbage", START_BOUND, lambda s: reader in s.search
            )
        else:
            ctx.skipped[kind + " (restart)"] = ctx.skipped.get(kind + " (restart)", 0) + 1
        healed: dict[str, float | None] = {}
        for field, value in order:
            try:
                await asyncio.to_thread(_hset, cluster, keys.meta, {field: value.encode("ascii")})
            except (sync_redis.RedisError, OSError) as exc:
                observer.violate("fault injected", f"{kind}: cannot write {keys.meta}: {exc}")
                return
            healed[field] = await ctx.converge(
                kind,
                f"P:meta {field} healed",
                bound,
                lambda s: s.redis is not None and s.redis_problems == 0,
            )
        watch.notes.update(
            restarted=restarted.name if restarted is not None else None,
            healed_s={k: round(v, 2) if v is not None else None for k, v in healed.items()},
        )


HOSTILE_FAULTS: dict[str, Callable[[FaultContext], Awaitable[None]]] = {
    "hostile_registration": hostile_registration,
    "hostile_endless_body": _hostile_peer("endless"),
    "hostile_garbage": _hostile_peer("garbage"),
    "hostile_trickle": _hostile_peer("trickle"),
    "hostile_huge_answer": _hostile_peer("huge"),
    "hostile_query_storm": hostile_query_storm,
    "hostile_redis_entry": hostile_redis_entry,
    "hostile_phantom_shard": hostile_phantom_shard,
    "hostile_loopback_target": hostile_loopback_target,
    "hostile_idle_flood": hostile_idle_flood,
}
#: The hostile category, in its schedule order.
HOSTILE_KINDS = tuple(HOSTILE_FAULTS)
