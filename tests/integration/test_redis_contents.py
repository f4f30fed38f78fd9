"""Redis contents can neither crash nor pin readers (issue 21, item 6).

* Every number read from Redis is bounded before it is parsed (pure decoder tests).
* A malformed ``P:meta`` is a ``MalformedLiveListError``: a search server starts
  anyway, keeps its list, counts it, and recovers when a leader publishes (real
  ZooKeeper and Redis).
* An epoch no election node ever had is detected by the leader, which holds its term
  without publishing (no election loop) until ``discovery fence repair`` resets the
  fence, after which every reader follows the repaired list.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from discovery.errors import MalformedLiveListError, MalformedMetaError
from discovery.livelist.redis.fence import StoredFence, read_fence, repair_fence
from discovery.livelist.redis.follower import LiveListReader
from discovery.livelist.redis.layout import (
    MAX_NUMBER,
    RedisKeys,
    load,
    parse_change,
    parse_heartbeat,
    parse_meta,
    parse_position,
)
from discovery.livelist.redis.publisher import LivePublisher
from discovery.livelist.redis.store import RedisLiveStore
from discovery.testing import RedisServer, free_port
from discovery.tools.fence import FenceReport, describe
from discovery.tools.status.model import Contender
from discovery.zk.epochs import highest_possible_epoch
from discovery.zk.paths import SEARCH_ELECTION_PATH
from discovery.zk.session import ZkSession
from search_server.server import SearchServer
from tests.support import (
    DataServerFactory,
    SearchServerFactory,
    cluster_of,
    eventually,
    get_json,
    make_instance,
    published_term,
    reap,
    sample,
    view,
    waited,
)

#: Numbers no writer of the layout writes, each with what makes it so.
GARBAGE_NUMBERS = {
    "5000 digits": "7" * 5000,  # int() itself raises ValueError on this
    "2**63": str(2**63),  # one above a Java long
    "20 digits": "9" * 20,
    "negative": "-1",
    "plus sign": "+1",
    "blank": " 1",
    "leading zero": "01",
    "underscore": "1_000",
    "arabic digit": "\u0663",
    "exponent": "1e3",
    "decimal point": "1.5",
    "empty": "",
    "not UTF-8": b"\xff\xfe",
}

VALID_META = {
    "epoch": "5",
    "version": "3",
    "leader": "ss-1",
    "published_at": "1700000000000",
    "count": "0",
    "writer": "w",
}


# -- the decoders: pure ----------------------------------------------------------------------


@pytest.mark.parametrize("garbage", list(GARBAGE_NUMBERS.values()), ids=list(GARBAGE_NUMBERS))
@pytest.mark.parametrize("field", ["epoch", "version", "published_at", "count", "fence"])
def test_every_number_of_the_meta_record_is_bounded(field: str, garbage: str | bytes) -> None:
    fields: dict[str, str | bytes] = {**VALID_META, field: garbage}
    with pytest.raises(MalformedLiveListError, match=field):
        parse_meta(fields)


@pytest.mark.parametrize("garbage", list(GARBAGE_NUMBERS.values()), ids=list(GARBAGE_NUMBERS))
@pytest.mark.parametrize("field", ["epoch", "version", "prev", "published_at", "fence"])
def test_every_number_of_a_stream_entry_is_bounded(field: str, garbage: str | bytes) -> None:
    fields: dict[bytes, str | bytes] = {
        b"epoch": "5",
        b"version": "3",
        b"prev": "2",
        b"kind": "delta",
        b"leader": "ss-1",
        b"published_at": "1",
        b"upserts": "[]",
        b"removes": "[]",
        b"fence": "0",
    }
    fields[field.encode()] = garbage
    with pytest.raises(MalformedLiveListError, match=field):
        parse_change(b"1-1", fields)


def test_the_largest_numbers_of_the_layout_are_accepted() -> None:
    meta = parse_meta(
        {"epoch": str(MAX_NUMBER), "version": str(MAX_NUMBER), "fence": str(MAX_NUMBER)}
    )
    assert meta is not None
    assert (meta.epoch, meta.version, meta.fence) == (MAX_NUMBER, MAX_NUMBER, MAX_NUMBER)
    assert (meta.published_at, meta.count) == (0, 0)  # optional fields, absent


@pytest.mark.parametrize("garbage", list(GARBAGE_NUMBERS.values()), ids=list(GARBAGE_NUMBERS))
def test_a_position_is_missing_or_malformed_never_a_crash(garbage: str | bytes) -> None:
    assert parse_position([None, None]) is None
    assert parse_position([b"7", None]) is None
    assert parse_position([b"7", b"2"]) == (7, 2)
    with pytest.raises(MalformedLiveListError):
        parse_position([garbage, b"2"])
    with pytest.raises(MalformedLiveListError):
        parse_position([b"7", garbage])


def test_heartbeat_numbers_out_of_bounds_are_left_out_and_reported() -> None:
    beat = parse_heartbeat(json.dumps({"leader": "x", "epoch": 2**64, "at": -5}), 100)
    assert (beat.leader, beat.epoch, beat.at, beat.ttl_ms) == ("x", None, None, 100)
    assert beat.error is not None
    assert "epoch" in beat.error
    assert "at" in beat.error
    huge = '{"epoch": ' + "9" * 5000 + "}"
    beat = parse_heartbeat(huge, -1)
    assert beat.epoch is None
    assert beat.error is not None
    assert parse_heartbeat(json.dumps({"epoch": 7, "version": 2}), 5).error is None


def _report(meta: dict[str, str] | None, leader_epoch: int | None, highest: int) -> FenceReport:
    fields = {} if meta is None else meta
    try:
        stored = StoredFence((None, None, None), parse_meta(fields))
    except MalformedLiveListError as exc:
        stored = StoredFence((None, None, None), None, str(exc))
    leader = (
        None if leader_epoch is None else Contender("ss-1", "x__lock__0000000001", leader_epoch)
    )
    return FenceReport("discovery:{c}", stored, leader, highest)


def test_the_fence_verdicts() -> None:
    cases = {
        "ok": _report({**VALID_META, "epoch": "100"}, 100, 120),
        "possible": _report({**VALID_META, "epoch": "110"}, 100, 120),
        "impossible": _report({**VALID_META, "epoch": str(2**62)}, 100, 120),
        "missing": _report(None, 100, 120),
        "malformed": _report({**VALID_META, "epoch": "9" * 20}, 100, 120),
    }
    for verdict, report in cases.items():
        assert report.verdict == verdict
        assert report.poisoned == (verdict == "impossible")
        text = "\n".join(describe(report))
        assert ("POISONED" in text) == (verdict == "impossible"), text
    # The repair stores one below the leader's epoch: its next write passes the fence.
    assert cases["impossible"].repair_epoch() == 99
    assert _report({**VALID_META, "epoch": str(2**62)}, None, 0).repair_epoch() == 0


# -- the follower (LiveListReader) against a real Redis ---------------------------------------


async def test_a_malformed_meta_at_start_is_counted_followed_from_the_stream_end_and_retried(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=7)
    servers = view(make_instance("ds-a"))
    await publisher.publish_full(servers)
    for _ in range(40):
        await publisher.publish_change(servers, added={}, changed=servers, removed={})
    await client.hset(keys.meta, "epoch", "7" * 5000)
    with pytest.raises(MalformedMetaError):
        await load(client, keys)
    reader = LiveListReader(
        client, redis_prefix, registry=registry, block=0.1, reconcile_interval=0.1
    )
    await reader.start()  # must not raise
    try:
        assert reader.current.version == 0
        assert sample(registry, "discovery_livelist_malformed_total", kind="meta") == 1
        started = time.monotonic()
        await asyncio.sleep(3.0)  # ok-sleep: the span over which retries are counted
        elapsed = time.monotonic() - started
        reads = sample(registry, "discovery_livelist_malformed_total", kind="meta")
        loads = sum(
            sample(registry, "discovery_livelist_refetches_total", cause=cause)
            for cause in ("start", "gap", "epoch", "full", "reconcile", "fence")
        )
        # Backoff 0.1, 0.2, 0.4, 0.8, 1.6 s: about 5 reads in 3 s, not one per 0.1 s
        # (30), and the 40 old entries of the stream caused no load each.
        assert 2 <= reads <= 8, (reads, elapsed)
        assert loads <= reads + 1, loads
        # The leader's next publish rewrites P:meta: the reader takes it at once.
        await publisher.publish_full(servers)
        current = await waited(reader.wait_until(lambda lst: lst.version > 0, 5), "a list")
        assert current.epoch == 7
        assert set(current.servers) == {"ds-a"}
    finally:
        await reader.aclose()


async def test_an_out_of_bounds_epoch_fences_nobody_and_unsound_meta_is_not_current(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=7)
    await publisher.publish_full(view(make_instance("ds-a")))
    assert await publisher.heartbeat()
    # A count readers refuse: the leader's heartbeat must not call P:meta its own...
    await client.hset(keys.meta, "count", "x")
    assert not await publisher.heartbeat()
    await publisher.publish_full(view(make_instance("ds-a")))
    assert await publisher.heartbeat()
    assert (await load(client, keys)).meta is not None
    # ...and an epoch above 2**63-1 is no number of the layout: it fences nobody.
    await client.hset(keys.meta, "epoch", "9" * 20)
    assert not await publisher.heartbeat()
    version = await publisher.publish_full(view(make_instance("ds-a")))
    loaded = await load(client, keys)
    assert loaded.meta is not None
    assert loaded.meta.position == (7, version)


async def test_status_reports_a_malformed_meta_instead_of_crashing(
    client: aioredis.Redis, redis_prefix: str
) -> None:
    keys = RedisKeys(redis_prefix)
    await client.hset(keys.meta, mapping={**VALID_META, "epoch": "7" * 5000})
    _heartbeat, published = await RedisLiveStore(client, redis_prefix).admin.read_published()
    assert published.live is None
    assert published.error is not None
    assert "epoch" in published.error


async def test_a_repaired_fence_releases_a_pinned_reader(
    client: aioredis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    keys = RedisKeys(redis_prefix)
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=7)
    servers = view(make_instance("ds-a"), make_instance("ds-b"))
    await publisher.publish_full(servers)
    async with LiveListReader(
        client, redis_prefix, registry=registry, reconcile_interval=0.2
    ) as reader:
        await client.hset(keys.meta, "epoch", str(2**62))
        await waited(reader.wait_until(lambda lst: lst.epoch == 2**62, 10), "the pinned list")
        stored = await read_fence(client, keys)
        assert stored.meta is not None
        assert stored.meta.epoch == 2**62
        # A stale read is refused: nothing written.
        await client.hset(keys.meta, "version", "99")
        assert await repair_fence(client, keys, stored, epoch=6, by="test") is None
        assert (await read_fence(client, keys)).meta.epoch == 2**62  # type: ignore[union-attr]
        stored = await read_fence(client, keys)
        repaired = await repair_fence(client, keys, stored, epoch=6, by="test")
        assert repaired is not None
        assert (repaired.epoch, repaired.generation, repaired.count) == (6, 1, 2)
        # Lower than what the reader held: taken because the generation moved on.
        current = await waited(reader.wait_until(lambda lst: lst.epoch == 6, 10), "repaired")
        assert (current.version, set(current.servers)) == (1, {"ds-a", "ds-b"})
        assert sample(registry, "discovery_livelist_refetches_total", cause="fence") >= 1
        # The real leader's next write passes the fence (its epoch is above 6), keeps
        # the generation, and the reader follows it as usual.
        fresh = LivePublisher(client, redis_prefix, leader_id="ss-1", epoch=7)
        assert not await fresh.heartbeat()
        await fresh.publish_full(view(make_instance("ds-a")))
        current = await waited(reader.wait_until(lambda lst: lst.epoch == 7, 10), "leader")
        assert set(current.servers) == {"ds-a"}
        meta = (await load(client, keys)).meta
        assert meta is not None
        assert meta.fence == 1


async def test_the_highest_possible_epoch_is_the_election_directorys_pzxid(
    zk_session: ZkSession,
) -> None:
    # No election directory: no leader was ever elected, so no epoch is possible.
    assert await highest_possible_epoch(zk_session, SEARCH_ELECTION_PATH) == 0
    await zk_session.ensure_path(SEARCH_ELECTION_PATH)
    node = await zk_session.create(f"{SEARCH_ELECTION_PATH}/n-", ephemeral=True, sequence=True)
    stat = await zk_session.exists(node)
    assert stat is not None
    # The newest election node's czxid (a leader's epoch) is the bound...
    assert await highest_possible_epoch(zk_session, SEARCH_ELECTION_PATH) == stat.czxid
    # ...and it only grows: a deletion moves it on, past every epoch held before.
    await zk_session.delete(node)
    assert await highest_possible_epoch(zk_session, SEARCH_ELECTION_PATH) > stat.czxid


# -- search servers: garbage P:meta before and while they run ---------------------------------

#: (field, garbage) written into an otherwise valid P:meta.
META_GARBAGE = {
    "epoch of 5000 digits": ("epoch", "7" * 5000),
    "epoch of 2**63": ("epoch", str(2**63)),
    "negative version": ("version", "-3"),
    "published_at with an exponent": ("published_at", "1e9"),
    "count not a number": ("count", "xyz"),
    "fence of 20 digits": ("fence", "9" * 20),
}


def _malformed_meta(server: SearchServer) -> float:
    return sample(server.registry, "discovery_livelist_malformed_total", kind="meta")


async def _routes_with(server: SearchServer, ids: set[str]) -> None:
    assert server.reader is not None
    await waited(
        server.reader.wait_until(lambda live: set(live.servers) == ids, timeout=15),
        f"{server.server_id} routing with {ids}",
    )


#: What a search server used to fail on at start (a crash, a pinned list, a field it
#: did not check); the other kinds it already skipped at start.
START_GARBAGE = {
    name: META_GARBAGE[name]
    for name in ("epoch of 5000 digits", "epoch of 2**63", "fence of 20 digits")
}


@pytest.mark.parametrize(("field", "garbage"), START_GARBAGE.values(), ids=list(START_GARBAGE))
async def test_a_search_server_starts_on_a_malformed_meta_and_recovers_once_a_leader_publishes(
    field: str,
    garbage: str,
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
    client: aioredis.Redis,
    redis_prefix: str,
) -> None:
    keys = RedisKeys(redis_prefix)
    await client.hset(keys.meta, mapping={**VALID_META, "epoch": "1", field: garbage})
    # Starts (a 5000-digit epoch used to fail start-up), routes with nothing, says why.
    reader = await make_search_server(server_id="ss-reader", leader_eligible=False)
    assert reader.reader is not None
    assert reader.reader.current.version == 0
    assert _malformed_meta(reader) >= 1
    status, body = await get_json(f"{reader.url}/readyz")
    assert status == 503
    assert body["version"] == 0
    # A leader comes: its first publish rewrites P:meta; the reader takes it.
    data = await make_data_server(shard=0)
    assert data.agent is not None
    leader = await make_search_server(server_id="ss-leader")
    term = await published_term(leader)
    await _routes_with(reader, {data.agent.instance.id})
    assert reader.reader.current.epoch == term.epoch
    meta = (await load(client, keys)).meta
    assert meta is not None
    assert meta.leader == "ss-leader"


@pytest.mark.parametrize(("field", "garbage"), META_GARBAGE.values(), ids=list(META_GARBAGE))
async def test_a_running_search_server_keeps_its_list_through_a_malformed_meta(
    field: str,
    garbage: str,
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
    client: aioredis.Redis,
    redis_prefix: str,
) -> None:
    keys = RedisKeys(redis_prefix)
    data = await make_data_server(shard=0)
    assert data.agent is not None
    ids = {data.agent.instance.id}
    first = await make_search_server(server_id="ss-first")
    reader = await make_search_server(server_id="ss-reader", leader_eligible=False)
    await published_term(first)
    await _routes_with(reader, ids)
    assert reader.reader is not None
    before = reader.reader.current
    # No leader for a while (the list stays in Redis); then P:meta goes bad.
    await first.shutdown()
    await client.hset(keys.meta, field, garbage)
    await eventually(lambda: _malformed_meta(reader) >= 1, message="the malformed meta counted")
    assert reader.reader.current == before  # kept, not emptied, not pinned
    # What is asked is that it routes, not how fast: a loaded machine's second is no miss.
    status, body = await get_json(f"{reader.url}/search", q="the", timeout_ms="5000")
    assert status == 200
    assert body["shards"]["ok"] == 1, body
    # A new leader publishes through the garbage; the reader follows it.
    leader = await make_search_server(server_id="ss-next")
    term = await published_term(leader)
    await waited(
        reader.reader.wait_until(lambda live: live.epoch == term.epoch, timeout=15),
        "the reader on the new leader's list",
    )
    assert set(reader.reader.current.servers) == ids
    assert (await load(client, keys)).meta is not None


# -- an epoch no election node ever had ---------------------------------------------------------

CLI_TIMEOUT = 60.0


async def run_fence(*args: str) -> tuple[int, str, str]:
    """``discovery fence ARGS`` in a subprocess: (exit code, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISCOVERY_")}
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "discovery.tools.main", "fence", *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        out, err = await waited(
            process.communicate(), f"`discovery fence {' '.join(args)}`", timeout=CLI_TIMEOUT
        )
    finally:
        await reap(process)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _fence_checks(server: SearchServer, verdict: str) -> float:
    return sample(server.registry, "discovery_leader_fence_checks_total", verdict=verdict)


def _terms(server: SearchServer) -> int:
    return server.election.terms if server.election is not None else -1


async def test_an_impossible_epoch_holds_the_leader_without_a_loop_until_the_fence_is_repaired(
    make_search_server: SearchServerFactory,
    make_data_server: DataServerFactory,
    client: aioredis.Redis,
    redis_server: RedisServer,
    redis_prefix: str,
    zk_hosts: str,
) -> None:
    keys = RedisKeys(redis_prefix)
    first = await make_data_server(shard=0)
    assert first.agent is not None
    ids = {first.agent.instance.id}
    leader = await make_search_server(server_id="ss-leader", fence_recheck_max=1.0)
    term = await published_term(leader)
    other = await make_search_server(server_id="ss-other", fence_recheck_max=1.0)
    await _routes_with(other, ids)
    assert other.reader is not None

    poison = 2**62  # within bounds, above every zxid this ZooKeeper has issued
    await client.hset(keys.meta, "epoch", str(poison))
    # Readers take it (it is a well-formed, higher position)...
    await waited(other.reader.wait_until(lambda live: live.epoch == poison, timeout=15), "pinned")
    # ...and the leader sees that no election node ever had it: it holds its term.
    await eventually(
        lambda: sample(leader.registry, "discovery_leader_fence_poisoned") == 1,
        message="the leader's poisoned gauge",
    )
    assert leader.cluster_view()["fence_poisoned"] is True
    poisoned_at = time.monotonic()
    tries = _fence_checks(leader, "impossible")
    await eventually(
        lambda: _fence_checks(leader, "impossible") >= tries + 2,
        timeout=15,
        message="two more tries of the fence",
    )
    # Tries back off (0.2 s doubling to 1 s): a heartbeat-paced loop would have made
    # one every 0.2 s. No election loop: the same process leads the same term, the
    # other never led.
    span = time.monotonic() - poisoned_at
    made = _fence_checks(leader, "impossible") - tries
    assert made <= span / 0.2 / 2 + 1, (made, span)
    assert leader.is_leader
    assert _terms(leader) == 1
    assert _terms(other) == 0
    assert sample(leader.registry, "discovery_leader_fence_checks_total", verdict="possible") == 0
    # Nothing is published meanwhile: a data server that joins is not listed yet.
    second = await make_data_server(shard=1)
    assert second.agent is not None
    assert set(other.reader.current.servers) == ids

    args = ["--zk", zk_hosts, "--redis", redis_server.url, "--cluster", cluster_of(redis_prefix)]
    code, out, err = await run_fence("check", *args)
    assert code == 1, err  # needs attention: poisoned
    assert f"epoch {poison}" in out
    assert "POISONED" in out
    assert "discovery fence repair" in out
    code, out, err = await run_fence("repair", "--json", *args)
    assert code == 0, err
    document = json.loads(out)
    assert document["verdict"] == "impossible"
    assert document["leader"]["czxid"] == term.epoch
    assert document["repaired"]["epoch"] == term.epoch - 1
    assert document["repaired"]["generation"] == 1

    # Readers follow the repaired list, then the leader's, which lists the newcomer.
    ids.add(second.agent.instance.id)
    for server in (leader, other):
        assert server.reader is not None
        await waited(
            server.reader.wait_until(
                lambda live: live.epoch == term.epoch and set(live.servers) == ids,
                timeout=15,
            ),
            f"{server.server_id} following the leader again",
        )
    assert sample(leader.registry, "discovery_leader_fence_poisoned") == 0
    assert _fence_checks(leader, "repaired") == 1
    assert leader.is_leader
    assert _terms(leader) == 1
    code, out, err = await run_fence("check", *args)
    assert code == 0, err
    assert "ok:" in out


async def test_fence_command_refuses_a_healthy_fence_and_names_flags(
    make_search_server: SearchServerFactory,
    client: aioredis.Redis,
    redis_server: RedisServer,
    redis_prefix: str,
    zk_hosts: str,
) -> None:
    leader = await make_search_server(server_id="ss-healthy")
    term = await published_term(leader)
    args = ["--zk", zk_hosts, "--redis", redis_server.url, "--cluster", cluster_of(redis_prefix)]
    code, out, err = await run_fence("check", "--json", *args)
    assert code == 0, err
    document: dict[str, Any] = json.loads(out)
    assert document["verdict"] == "ok"
    assert document["meta"]["epoch"] == term.epoch
    assert document["leader"]["id"] == "ss-healthy"
    assert document["highest_possible_epoch"] >= term.epoch
    # Nothing to repair: refused, naming --force; nothing written.
    code, out, err = await run_fence("repair", *args)
    assert code == 1  # nothing written
    assert "--force" in err
    assert "not poisoned" in err
    assert leader.reader is not None
    assert leader.reader.current.epoch == term.epoch
    # --force repairs a healthy fence too: the leader's next write passes it again and
    # every reader follows (the generation moved on).
    code, out, err = await run_fence("repair", "--force", *args)
    assert code == 0, err
    assert f"epoch {term.epoch - 1} version 1 with fence generation 1" in out
    await waited(
        leader.reader.wait_until(
            lambda live: live.epoch == term.epoch and live.leader == "ss-healthy", timeout=15
        ),
        "the leader's list after a forced repair",
    )
    meta = (await load(client, RedisKeys(redis_prefix))).meta
    assert meta is not None
    assert (meta.epoch, meta.fence, meta.leader) == (term.epoch, 1, "ss-healthy")
    # Bad arguments name the flag; unreachable systems are named.
    code, _, err = await run_fence("check", "--session-timeout", "-1", *args)
    assert code == 2
    assert "--session-timeout" in err
    code, _, err = await run_fence("check", "--zk", zk_hosts, "--redis", "ftp://x:1")
    assert code == 2
    assert "--redis" in err
    port = free_port()
    code, _, err = await run_fence(
        "check", "--zk", zk_hosts, "--redis", f"redis://:s3cret@127.0.0.1:{port}/0"
    )
    assert code == 3  # unreachable
    assert f"cannot use Redis at redis://:***@127.0.0.1:{port}/0" in err
    assert "s3cret" not in err
    code, _, err = await run_fence(
        "check", "--zk", f"127.0.0.1:{free_port()}", "--zk-connect-timeout", "1", *args[2:]
    )
    assert code == 3
    assert "cannot use ZooKeeper" in err
