"""The hostile category of ``discovery chaos``: what its faults write and how they are judged.

The faults themselves run in ``make chaos-ci`` against a real cluster; these tests pin
down the parts that decide what a run means (the watch's verdicts, the memory readings,
the observer's tolerance of what a hostile fault wrote on purpose) and that the hostile
participants are as hostile as they claim (each malformed registration is refused by
the contract's own decoder, the hostile peer's answers are refused by the search
server's own sub-request client, the storm's query is the shard's worst).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiohttp import web

from data_server.corpus import generate_documents
from data_server.index import InvertedIndex
from data_server.loadgen import LoadConfig, run_worst_case, worst_case_query
from discovery.errors import ZkNoNodeError
from discovery.http import MAX_QUERY_LENGTH
from discovery.instance import InstanceState, ServiceInstance
from discovery.livelist.redis.layout import RedisKeys, parse_servers
from discovery.livelist.redis.store import RedisLiveStore
from discovery.testing.ports import free_port
from discovery.testing.redis import RedisServer
from discovery.tools.chaos.hostile import (
    hostile_fields,
    hostile_registrations,
    storm_totals,
)
from discovery.tools.chaos.hostile_peer import (
    HUGE_HITS,
    HUGE_ID,
    HostilePeer,
    huge_answer,
    trickle_answer,
)
from discovery.tools.chaos.hostile_reach import IdleFlood
from discovery.tools.chaos.memory import Memory, parse_status, read_memory, reset_peak
from discovery.tools.chaos.observer import Observer, Snapshot
from discovery.tools.chaos.report import hostile_table, render, to_json
from discovery.tools.chaos.watch import (
    HITS,
    LISTS,
    MEMORY,
    MIB,
    OFFLINE,
    SHARDS,
    Answer,
    HostileWatch,
    missing_shards,
)
from discovery.zk.membership import PERSISTENT_DYNAMIC, decode_child
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.session import NodeStat
from search_server.httpclient import Endpoint, HttpClient, SubrequestError
from tests.conftest import fast_redis_client
from tests.support import SessionFactory, absent, eventually, frequent_terms, reap, shard_counts

# -- the watch's verdicts -------------------------------------------------------------


def _answer(missing: int | None, *, status: int | None = 200, outcome: str = "partial") -> Answer:
    return Answer(1.0, "search-1", outcome, missing, 12.0, status, "detail")


def test_an_answer_may_miss_only_the_shards_the_bad_participant_serves() -> None:
    watch = HostileWatch("hostile_trickle", healthy=frozenset(), allowed_missing=1)
    assert watch.answer(_answer(0, outcome="complete")) == []
    assert watch.answer(_answer(1)) == []  # its own shard, while it is being ejected
    [(invariant, detail)] = watch.answer(_answer(2))
    assert invariant == SHARDS
    assert "missed 2 shards" in detail
    # Not a search result at all (the 500s of a registration nobody could encode).
    [(invariant, detail)] = watch.answer(_answer(None, status=500, outcome="failed"))
    assert invariant == SHARDS
    assert "status 500" in detail
    [(invariant, detail)] = watch.answer(_answer(None, status=None, outcome="failed"))
    assert "no answer" in detail
    strict = HostileWatch("hostile_registration", healthy=frozenset(), allowed_missing=0)
    assert [v for v, _ in strict.answer(_answer(1))] == [SHARDS]


def test_a_storm_judges_completion_and_never_a_normal_query_refused() -> None:
    watch = HostileWatch("hostile_query_storm", healthy=frozenset(), allowed_missing=None)
    # Partial answers are counted, not judged one by one: the 90 % rule decides.
    assert watch.answer(Answer(1.0, "search-1", "partial", 3, 400.0, 200)) == []
    assert watch.answer(Answer(2.0, "search-1", "complete", 0, 10.0, 200)) == []
    assert watch.answer(Answer(3.0, "search-2", "complete", 0, 10.0, 200)) == []
    assert watch.completion("search-1", 0.0, 10.0) == (1, 2)
    assert watch.completion(None, 0.0, 10.0) == (2, 3)
    assert watch.completion(None, 2.5, 10.0) == (1, 1)  # sent before the storm: out
    [(invariant, detail)] = watch.answer(Answer(4.0, "search-1", "failed", None, 1.0, 422))
    assert invariant == SHARDS
    assert "query of death" in detail
    watch.answer(Answer(5.0, "search-1", "failed", None, 1.0, 503))
    watch.answer(Answer(6.0, "search-1", "failed", None, 500.0))
    assert watch.shortfall("search-1", 0.0, 10.0) == {
        "no answer": 1,
        "partial": 1,
        "status 422": 1,
        "status 503": 1,
    }
    assert watch.shortfall("search-2", 0.0, 10.0) == {}


def test_missing_shards_counts_failed_timed_out_cut_and_missing_only() -> None:
    shards = shard_counts(17, 12, failed=1, timed_out=1, cut=1, missing=2)
    assert missing_shards(shards) == 5
    # What a hostile answer could hold instead of counts is not a count.
    assert missing_shards({"failed": True, "timed_out": "9", "cut": -4}) == 0


def _snapshot(model: set[str], **views: object) -> Snapshot:
    frozen = frozenset(model)
    fields: dict[str, object] = {
        "at": 3.0,
        "model": frozen,
        "zk": frozen,
        "redis": frozen,
        "redis_epoch": 5,
        "search": {"search-1": frozen},
    }
    fields.update(views)
    return Snapshot(**fields)  # type: ignore[arg-type]


def test_a_hostile_replicas_hits_in_a_result_are_a_violation() -> None:
    """A huge answer is valid: the hits it would put on top are what betrays it."""
    watch = HostileWatch(
        "hostile_huge_answer", healthy=frozenset(), allowed_missing=1, forbidden_hits=HUGE_ID
    )
    clean = Answer(1.0, "search-1", "complete", 0, 5.0, 200, "", ("d-1", "d-2"))
    assert watch.answer(clean) == []
    tainted = Answer(1.0, "search-1", "complete", 0, 5.0, 200, "", ("d-1", f"{HUGE_ID}7"))
    ((invariant, detail),) = watch.answer(tainted)
    assert invariant == HITS
    assert f"{HUGE_ID}7" in detail
    # Another kind's watch does not judge hits at all.
    plain = HostileWatch("hostile_garbage", healthy=frozenset(), allowed_missing=1)
    assert plain.answer(tainted) == []


def test_a_healthy_server_missing_from_any_view_is_reported_once_per_view() -> None:
    healthy = {"ds-1", "ds-2"}
    watch = HostileWatch("hostile_garbage", healthy=frozenset(healthy), allowed_missing=1)
    # The hostile peer in the model and the views is no problem; an unreadable view
    # (Redis restarting) proves nothing either way.
    assert watch.snapshot(_snapshot(healthy | {"hostile-x"}, redis=None)) == []
    lost = _snapshot(healthy, zk=frozenset({"ds-1"}), search={"search-1": frozenset({"ds-1"})})
    found = watch.snapshot(lost)
    assert [v for v, _ in found] == [OFFLINE, OFFLINE]
    assert "ds-2 missing from zookeeper" in found[0][1]
    assert watch.snapshot(lost) == []  # once per server and view
    assert watch.figures().servers_lost == ["ds-2"]


def test_for_registrations_and_redis_entries_no_view_lists_more_than_the_model() -> None:
    healthy = {"ds-1", "ds-2"}
    watch = HostileWatch(
        "hostile_registration",
        healthy=frozenset(healthy),
        allowed_missing=0,
        lists_equal_model=True,
    )
    assert watch.snapshot(_snapshot(healthy)) == []
    leaked = _snapshot(healthy, redis=frozenset(healthy | {"hostile-ab-persistent"}))
    [(invariant, detail)] = watch.snapshot(leaked)
    assert invariant == LISTS
    assert "redis lists ['hostile-ab-persistent']" in detail
    # A peer kind does not demand equality: its own replica is listed on purpose.
    peer = HostileWatch("hostile_garbage", healthy=frozenset(healthy), allowed_missing=1)
    assert peer.snapshot(leaked) == []


def test_memory_is_judged_against_its_value_when_the_fault_began() -> None:
    watch = HostileWatch("hostile_endless_body", healthy=frozenset(), allowed_missing=1)
    watch.memory_before("search-1", 100, Memory(rss=50 * MIB, peak=50 * MIB))
    watch.memory_before("search-2", 200, Memory(rss=60 * MIB, peak=90 * MIB))
    watch.memory("search-1", 100, Memory(rss=55 * MIB, peak=80 * MIB), peak_reset=False)
    watch.memory("search-2", 200, Memory(rss=61 * MIB, peak=200 * MIB), peak_reset=False)
    assert watch.memory_verdicts() == []  # a peak from before the fault is not its own
    # The peak since the fault began (VmHWM reset when it began) counts, however short.
    watch.memory("search-1", 100, Memory(rss=55 * MIB, peak=120 * MIB), peak_reset=True)
    [(invariant, detail)] = watch.memory_verdicts()
    assert invariant == MEMORY
    assert "search-1 grew from 50.0 MiB to 120.0 MiB" in detail
    # A process started during the fault (another pid) has nothing to compare with.
    watch.memory("search-2", 201, Memory(rss=900 * MIB, peak=900 * MIB), peak_reset=True)
    assert len(watch.memory_verdicts()) == 1
    assert watch.figures().rss_peak_delta == 70 * MIB


def test_proc_status_gives_resident_and_peak_bytes() -> None:
    text = "Name:\tpython\nVmPeak:\t  300 kB\nVmHWM:\t   2048 kB\nVmRSS:\t   1024 kB\n"
    assert parse_status(text) == Memory(rss=1024 * 1024, peak=2048 * 1024)
    assert parse_status("Name:\tkthreadd\nState:\tS\n") is None  # a kernel thread
    memory = read_memory(os.getpid())
    assert memory is not None
    assert 0 < memory.rss <= memory.peak
    assert read_memory(2**22 + 12345) is None  # no such process
    # A peak 64 MiB above what we use, so that the reset shows whatever else the process
    # does meanwhile: its other threads (pytest-xdist's among them) may add a page or two,
    # and the reset peak is the resident size then, not at the first read.
    spike = b"\x01" * (64 << 20)
    del spike
    before = read_memory(os.getpid())
    assert before is not None
    assert before.peak >= before.rss + (32 << 20)
    assert reset_peak(os.getpid())  # the owner may; Linux 4.0 on
    after = read_memory(os.getpid())
    assert after is not None
    assert after.peak < before.peak - (32 << 20)


# -- what the hostile participants write ----------------------------------------------


def test_every_hostile_registration_and_rewrite_is_refused_by_the_contract() -> None:
    nodes = hostile_registrations("ab12cd", impersonate="ds-0003", port=4000)
    reasons = {}
    for node in nodes:
        stat = NodeStat(1, 0 if node.persistent else 0x1234, 1, 1, 0, 1)
        for data in filter(None, (node.data, node.rewrite)):
            decoded = decode_child(node.child, data, stat)
            assert isinstance(decoded, str), f"{node.child} was accepted: {decoded}"
            reasons.setdefault(node.child, []).append(decoded.split(":", 1)[0])
    assert reasons == {
        "hostile-ab12cd-json": ["malformed", "malformed"],
        "hostile-ab12cd-unicode": ["malformed", "malformed"],
        "hostile-ab12cd-label": ["malformed", "malformed"],
        "hostile-ab12cd-linklocal": ["malformed", "malformed"],
        "hostile-ab12cd-persistent": [PERSISTENT_DYNAMIC],
        "hostile-ab12cd-static": ["persistent"],
        "hostile-ab12cd-impostor": ["id_mismatch", "id_mismatch"],
    }
    documents = {node.child: node.data for node in nodes}
    assert "d\u00e4t\u00e4.example" in documents["hostile-ab12cd-unicode"].decode()
    assert ("a" * 70 + ".example") in documents["hostile-ab12cd-label"].decode()
    assert b"169.254.169.254" in documents["hostile-ab12cd-linklocal"]
    assert json.loads(documents["hostile-ab12cd-impostor"])["id"] == "ds-0003"
    # Each rewrite is another way to be wrong, so a changed child is judged again.
    assert all(node.rewrite != node.data for node in nodes if node.rewrite is not None)


def test_hostile_redis_fields_are_skipped_by_readers() -> None:
    fields = hostile_fields("ab12cd", 4000)
    servers, problems = parse_servers(fields)
    assert servers == {}
    assert len(problems) == 2


async def _exchange(port: int, limit: int = 1 << 20, seconds: float = 0.5) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /search?q=a&timeout_ms=100 HTTP/1.1\r\nHost: x\r\n\r\n")
    received = b""
    try:
        async with asyncio.timeout(seconds):
            while len(received) < limit:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                received += chunk
    except TimeoutError:
        pass
    writer.close()
    return received


#: ``await serve_peer(mode, trickle_interval=...)`` -> the peer and its port.
PeerFactory = Callable[..., Awaitable[tuple[HostilePeer, int]]]


@pytest.fixture
async def serve_peer() -> AsyncIterator[PeerFactory]:
    started: list[tuple[HostilePeer, asyncio.Server]] = []

    async def serve(mode: str, **options: float) -> tuple[HostilePeer, int]:
        peer = HostilePeer(
            mode, shard=3, seed=7, trickle_interval=options.get("trickle_interval", 0.001)
        )
        server = await asyncio.start_server(peer.handle, "127.0.0.1", 0)
        started.append((peer, server))
        return peer, server.sockets[0].getsockname()[1]

    yield serve
    for peer, server in started:
        server.close()
        await peer.aclose()
        await server.wait_closed()


async def test_the_endless_peer_never_ends_in_any_of_its_framings(
    serve_peer: PeerFactory,
) -> None:
    peer, port = await serve_peer("endless")
    heads = []
    for _ in range(3):
        received = await _exchange(port, limit=2 << 20)
        assert len(received) >= 2 << 20  # still sending when we stop reading
        heads.append(received.split(b"\r\n\r\n", 1)[0])
    assert any(b"Transfer-Encoding: chunked" in head for head in heads)
    assert any(b"Content-Length: 1000000000000" in head for head in heads)
    assert any(b"Connection: close" in head for head in heads)
    await peer.aclose()  # ends every endless answer still being written
    assert peer.summary()["requests"] == 3


async def test_the_trickling_peer_sends_a_valid_answer_byte_by_byte(
    serve_peer: PeerFactory,
) -> None:
    peer, port = await serve_peer("trickle")
    received = await _exchange(port, seconds=5.0, limit=len(trickle_answer(3)))
    assert received == trickle_answer(3)
    _head, body = received.split(b"\r\n\r\n", 1)
    assert json.loads(body)["shard"] == 3
    assert peer.summary()["bytes_sent"] == len(received)


async def test_the_huge_peer_answers_every_request_validly_with_too_many_hits(
    serve_peer: PeerFactory,
) -> None:
    """Two requests on one kept-alive connection, each answered in full: a success by
    every rule but its size and scores."""
    peer, port = await serve_peer("huge")
    expected = huge_answer(3)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(2):
            writer.write(b"GET /search?q=a&k=10 HTTP/1.1\r\nHost: x\r\n\r\n")
            async with asyncio.timeout(30):
                received = await reader.readexactly(len(expected))
            assert received == expected
    finally:
        writer.close()
    body = json.loads(expected.split(b"\r\n\r\n", 1)[1])
    assert body["shard"] == 3
    assert len(body["hits"]) == HUGE_HITS
    assert all(hit["score"] == 1e308 and hit["id"].startswith(HUGE_ID) for hit in body["hits"])
    assert 7 * MIB < len(expected) < 8 * MIB
    assert peer.summary()["requests"] == 2


async def test_an_idle_flood_holds_its_connections_and_sees_the_servers_closes() -> None:
    """The flood counts what the server closed; every connection made one request."""
    requests = 0

    async def healthz(_request: web.Request) -> web.Response:
        nonlocal requests
        requests += 1
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, keepalive_timeout=3600)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    flood = IdleFlood("127.0.0.1", port)
    try:
        await flood.open(5)
        assert flood.opened == 5
        assert requests == 5
        assert flood.closed_by_server == 0
        await runner.cleanup()  # the server closes every kept-alive connection
        await eventually(lambda: flood.closed_by_server == 5, timeout=10)
    finally:
        await flood.aclose()
        await runner.cleanup()


async def test_the_hostile_peers_answers_are_refused_by_the_sub_request_client(
    serve_peer: PeerFactory,
) -> None:
    """What the chaos kinds rely on: each peer is a bad replica for the real client (the
    endless body past its cap, the garbage unparsable, the trickle past a deadline)."""
    async with HttpClient(max_body=256 * 1024) as client:
        for mode in ("endless", "garbage"):
            for _ in range(3):  # every framing, and garbage with and without a status line
                _peer, port = await serve_peer(mode)
                future = client.get(Endpoint.of("127.0.0.1", port), b"/search?q=a")
                with pytest.raises(SubrequestError):
                    async with asyncio.timeout(10):
                        await future
        _peer, port = await serve_peer("trickle", trickle_interval=0.05)
        future = client.get(Endpoint.of("127.0.0.1", port), b"/search?q=a")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await asyncio.shield(future)
        future.cancel()


async def test_a_stopped_hostile_peer_is_marked_draining_before_it_leaves(
    zk_hosts: str, make_session: SessionFactory
) -> None:
    """A departure the leader takes for a deliberate one: the mass-loss brake never
    holds it (and lists the stopped peer again) when other servers vanish soon after."""
    session = await make_session()
    name = "hostile-garbage-stopped"
    path = f"{DATA_SERVERS_PATH}/{name}"
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "discovery.tools.chaos.hostile_peer", "--mode", "garbage"),
        *("--zk", zk_hosts, "--id", name, "--shard", "0"),
        *("--host", "127.0.0.1", "--port", str(free_port())),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )

    def state_is(expected: InstanceState) -> Callable[[], Awaitable[bool]]:
        async def probe() -> bool:
            try:
                data, _stat = await session.get(path)
            except ZkNoNodeError:
                return False
            return ServiceInstance.from_json(data).payload.state is expected

        return probe

    try:
        await eventually(state_is(InstanceState.SERVING), timeout=30, message="registered")
        process.send_signal(signal.SIGTERM)
        await eventually(state_is(InstanceState.DRAINING), message="marked draining")
        await eventually(lambda: absent(session, path), message="gone")
        assert await asyncio.wait_for(process.wait(), timeout=30) == 0
    finally:
        await reap(process)


def test_garbage_is_seeded_and_bounded() -> None:
    from discovery.tools.chaos.hostile_peer import garbage

    first = garbage(random.Random(3), with_status_line=False)
    assert first == garbage(random.Random(3), with_status_line=False)
    assert 1 <= len(first) <= 64 * 1024
    assert garbage(random.Random(3), with_status_line=True).startswith(b"HTTP/1.1 200 OK\r\n")


# -- the storm ------------------------------------------------------------------------


@pytest.mark.parametrize("shard", [0, 4])
def test_the_storms_query_is_the_shards_most_frequent_terms(shard: int) -> None:
    query = worst_case_query(docs=300, shard=shard)
    index = InvertedIndex(generate_documents(300, shard=shard))
    assert query == frequent_terms(index, 150)
    assert len(query.split()) == 150
    # A larger shard's terms are longer words; the query is cut to what a server takes.
    long = worst_case_query(docs=300, shard=shard, terms=1000)
    assert len(long) <= MAX_QUERY_LENGTH
    assert long.startswith(query)


async def test_the_storm_counts_refusals_and_keeps_sending_without_pause(
    aiohttp_free_port: int,
) -> None:
    seen: list[str] = []

    async def search(request: web.Request) -> web.Response:
        seen.append(request.query["q"])
        if len(seen) % 2:
            return web.json_response({"error": "query of death"}, status=422)
        return web.json_response({"hits": [], "partial": len(seen) % 4 == 0})

    app = web.Application()
    app.router.add_get("/search", search)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", aiohttp_free_port).start()
    try:
        config = LoadConfig(
            targets=(f"http://127.0.0.1:{aiohttp_free_port}",),
            duration=0.5,
            worst_case=True,
            clients=4,
        )
        totals = await run_worst_case(config, "worst query", asyncio.Event())
    finally:
        await runner.cleanup()
    assert set(seen) == {"worst query"}
    assert totals["refused"] >= 10  # back to back: far more than a paced client
    assert totals["ok"] + totals["partial"] + totals["refused"] == len(seen)
    assert totals["error"] == 0


@pytest.fixture
def aiohttp_free_port() -> int:
    from discovery.testing.ports import free_port

    return free_port()


def test_storm_totals_are_read_from_the_loadgens_last_line(tmp_path: Path) -> None:
    log = tmp_path / "storm.log"
    log.write_text(
        "worst case: 150 terms of shard 3\n"
        "total ok=3 partial=1 refused=40 overloaded=0 error=0 p50=1.0ms p99=9.0ms\n"
    )
    assert storm_totals(log)["refused"] == 40
    assert storm_totals(tmp_path / "missing.log") == {}


# -- the observer and the report ------------------------------------------------------


async def test_the_observer_tolerates_malformed_redis_contents_only_during_their_fault(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    keys = RedisKeys(redis_prefix)
    client = fast_redis_client(redis_server.url)
    observer = Observer(
        SimpleNamespace(data={}),  # type: ignore[arg-type]
        store=RedisLiveStore(client, redis_prefix).admin,
    )
    try:
        await client.hset(
            keys.meta, mapping={"epoch": "5", "version": "2", "leader": "s1", "count": "2"}
        )
        await client.hset(keys.servers, mapping=hostile_fields("ab12cd", 4000))
        assert await observer._read_store() == (frozenset(), 5, 2, None)  # no heartbeat
        assert [v.invariant for v in observer.violations] == ["published list readable"]
        await client.hset(keys.meta, "epoch", "9" * 5000)
        observer.violations.clear()
        watch = HostileWatch(
            "hostile_redis_entry",
            healthy=frozenset(),
            allowed_missing=0,
            lists_equal_model=True,
            redis_garbage=True,
        )
        observer.hostile = watch
        assert await observer._read_store() == (None, None, 0, None)  # unreadable, not a crash
        assert observer.violations == []
        observer.hostile = None
        assert await observer._read_store() == (None, None, 0, None)
        assert [v.invariant for v in observer.violations] == ["published list readable"]
    finally:
        await client.aclose()


def test_the_report_has_a_hostile_table_per_kind() -> None:
    from discovery.tools.chaos import ChaosConfig, ChaosResult

    first = HostileWatch("hostile_endless_body", healthy=frozenset(), allowed_missing=1)
    first.memory_before("search-1", 1, Memory(50 * MIB, 50 * MIB))
    first.memory("search-1", 1, Memory(52 * MIB, 66 * MIB), peak_reset=True)
    for ms in (10.0, 20.0, 480.0):
        first.answer(Answer(1.0, "search-1", "complete", 0, ms, 200))
    first.notes["requests"] = 12
    second = HostileWatch("hostile_endless_body", healthy=frozenset(), allowed_missing=1)
    second.answer(Answer(1.0, "search-1", "partial", 1, 30.0, 200))
    table = hostile_table([first.figures(), second.figures()])
    row = table["hostile_endless_body"]
    assert (row["count"], row["complete"], row["partial"]) == (2, 3, 1)
    assert row["max_missing_shards"] == 1
    assert row["rss_peak_delta_mib"] == 16.0
    assert row["p99_ms"] == 480.0
    assert row["servers_lost"] == []
    result = ChaosResult(ChaosConfig(duration=10, partitions=False), started=True)
    result.hostile = [first.figures(), second.figures()]
    text = render(result)
    assert "hostile_endless_body       2" in text
    assert "requests 12" in text
    record = to_json(result)
    assert record["hostile"]["hostile_endless_body"]["count"] == 2
    assert [f["partial"] for f in record["hostile_faults"]] == [0, 1]
    assert record["hostile_faults"][0]["rss_peak_delta_mib"] == 16.0
    json.dumps(record)  # what --report writes
