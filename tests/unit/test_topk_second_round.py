"""The second round of the top k: a query whose merge may be inexact asks the flagged
shards again, for k, and merges again; nothing else changes.

The client here (:class:`_Shards`) answers as a data server would (the best ``k`` of its
port's documents, ``k`` read from the request), at once unless the test holds the port;
what a port answers to the second round's request (the query's whole ``k``) can be
scripted. The timer (:class:`ManualTimer`) moves only when the test says.

The shapes used: 4 shards of 1,000 documents, ``k`` = 20, so that each is asked for 14
at the default probability (7 at 0.5). Shard 0 holds the best documents ("concentrated"):
its 14 all make the first merge's top 20, so it is flagged, and the exact top 20 is its
own 20 best. The other shards' documents rank below, spread: never flagged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest
from prometheus_client import CollectorRegistry

from discovery.instance import ServiceInstance
from search_server.config import SearchServerConfig, build_parser
from search_server.coverage import CoveragePolicy
from search_server.fanout import FanOut, FanOutConfig, FanOutResult
from search_server.httpclient import Endpoint, Response, SubrequestError
from search_server.picking import Replica
from search_server.topk import hits_asked
from tests.support import FakeClock, ManualTimer, make_instance, sample, shard_counts

PORT = 23_000
#: Shard 0's second replica (the same documents as PORT's).
PORT_B = PORT + 10
K = 20
DEADLINE_MS = 1000
# Times in binary fractions of a second, so that sums of them are exact on the timer.
STEP = 1 / 8

#: (id, score), best first.
Ranking = list[tuple[str, float]]


def _ranked(shard: int, scores: Sequence[float]) -> Ranking:
    return [(f"s{shard}-{i}", score) for i, score in enumerate(scores)]


def _documents() -> dict[int, Ranking]:
    """Shard 0 holds the 40 best documents; shards 1-3 lower ones, interleaved."""
    documents = {PORT + s: _ranked(s, [1000.0 - (i * 3 + s) for i in range(40)]) for s in (1, 2, 3)}
    documents[PORT] = documents[PORT_B] = _ranked(0, [5000.0 - i for i in range(40)])
    return documents


class _Shards:
    """Answers each port at once with the best ``k`` of ``documents[port]``, except the
    ports in ``held`` (every request) or ``hold_next`` (the next one), whose requests
    wait for :meth:`release`. ``second[port]`` is what a port answers instead to a
    request for ``K`` hits (the second round's): an exception, or a status and body.
    ``sent`` keeps (port, hits asked), in order."""

    def __init__(self, documents: dict[int, Ranking]) -> None:
        self.documents = documents
        self.held: set[int] = set()
        self.hold_next: set[int] = set()
        self.second: dict[int, BaseException | Response] = {}
        self.sent: list[tuple[int, int]] = []
        self._pending: dict[int, list[tuple[asyncio.Future[Response], int]]] = {}

    def get(
        self, endpoint: Endpoint, target: bytes, max_body: int | None = None
    ) -> asyncio.Future[Response]:
        port = endpoint.port
        hits = int(parse_qs(urlsplit(target.decode()).query)["k"][0])
        self.sent.append((port, hits))
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        if port in self.held or port in self.hold_next:
            self.hold_next.discard(port)
            self._pending.setdefault(port, []).append((future, hits))
        else:
            self._answer(future, port, hits)
        return future

    def _answer(self, future: asyncio.Future[Response], port: int, hits: int) -> None:
        if future.done():
            return
        scripted = self.second.get(port) if hits == K else None
        if isinstance(scripted, BaseException):
            future.set_exception(scripted)
        elif scripted is not None:
            future.set_result(scripted)
        else:
            future.set_result((200, _body(port, self.documents[port][:hits])))

    def release(self, port: int) -> None:
        """Answer the port's requests held so far, and the next ones at once."""
        self.held.discard(port)
        for future, hits in self._pending.pop(port, []):
            self._answer(future, port, hits)

    def out(self, port: int) -> list[asyncio.Future[Response]]:
        return [future for future, _ in self._pending.get(port, [])]

    def asked_for_k(self) -> list[int]:
        """The ports asked for the whole ``K``: the second round's requests."""
        return [port for port, hits in self.sent if hits == K]

    async def aclose(self) -> None:
        pass


def _body(port: int, hits: Ranking, **fields: Any) -> bytes:
    shard = 0 if port == PORT_B else port - PORT
    return orjson.dumps(
        {"hits": [{"id": i, "score": score} for i, score in hits], "shard": shard, **fields}
    )


class _Prefer:
    """Picks the replica of ``port`` whenever it is a candidate (settable)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def pick(self, candidates: Sequence[Replica]) -> Replica:
        return next((r for r in candidates if r.instance.port == self.port), candidates[0])


class _Samples:
    """An admission limit that keeps the latency samples it is told (never limiting)."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    @property
    def limit(self) -> int:
        return 1000

    def on_sample(self, now: float, latency: float, in_flight: int, dropped: bool) -> None:
        self.samples.append(latency)


class Rig:
    """A fan-out over the four shards (shard 0 with a second replica at ``PORT_B``) on a
    manual timer, ``eject_after`` 3: a charged failure shows in a replica's count."""

    def __init__(self, registry: CollectorRegistry, **config: Any) -> None:
        config.setdefault("hedge_ratio", 0)
        self.registry = registry
        self.client = _Shards(_documents())
        self.timer = ManualTimer()
        self.picker = _Prefer(PORT)
        self.admission = _Samples()
        self.servers: list[ServiceInstance] = [
            *(make_instance(f"ds-{s}", PORT + s, shard=s, docs=1000) for s in range(4)),
            make_instance("ds-0b", PORT_B, shard=0, replica=1, docs=1000),
        ]
        self.fanout = FanOut(
            self.client,
            config=FanOutConfig(eject_after=3, **config),
            registry=registry,
            clock=FakeClock(),
            timer=self.timer,
            picker=self.picker,
            admission=self.admission,
        )

    async def start(self, **search: Any) -> asyncio.Task[FanOutResult]:
        """A query, sent (at the timer's time now) and its answers in."""
        task = asyncio.create_task(self.fanout.search(self.servers, "a", K, DEADLINE_MS, **search))
        await _turns()
        return task

    async def search(self, **search: Any) -> FanOutResult:
        task = await self.start(**search)
        assert task.done(), "the query waits for something the test holds"
        return task.result()

    async def after(self, task: asyncio.Task[FanOutResult], seconds: float) -> bool:
        """Move the timer ``seconds`` on; whether the query has ended by then."""
        self.timer.advance(seconds)
        await _turns()
        return task.done()

    def metric(self, name: str, **labels: str) -> float:
        return sample(self.registry, f"search_server_fanout_{name}", **labels)

    def second_rounds(self) -> tuple[float, float, float]:
        """(ok, incomplete, shards re-asked)."""
        return (
            self.metric("topk_second_rounds_total", result="ok"),
            self.metric("topk_second_rounds_total", result="incomplete"),
            self.metric("topk_second_round_shards_total"),
        )

    def failures(self, port: int) -> int:
        replica = self.fanout.replica(next(i for i in self.servers if i.port == port))
        assert replica is not None
        return replica.failures


async def _turns() -> None:
    """Let the loop run the callbacks due (answers arrive in callbacks); no time passes."""
    for _ in range(20):
        await asyncio.sleep(0)  # ok-sleep: loop turns, on a manual timer (no time passes)


def _ids(result: FanOutResult) -> list[str]:
    return [hit["id"] for hit in result.hits]


#: What the first round's merge gives: shard 0's 14 asked, then the best 6 of the rest.
ASKED = hits_asked(K, [1000] * 4, 0.9999)[0]
FIRST_ROUND = [f"s0-{i}" for i in range(ASKED)] + [
    f"s{1 + i % 3}-{i // 3}" for i in range(K - ASKED)
]
EXACT = [f"s0-{i}" for i in range(K)]


def test_the_shapes_are_what_the_tests_say() -> None:
    assert ASKED == 14
    assert hits_asked(K, [1000] * 4, 0.5)[0] == 7


async def test_a_flagged_shard_is_asked_again_for_k_and_the_merge_is_exact(
    registry: CollectorRegistry,
) -> None:
    rig = Rig(registry)
    result = await rig.search()

    # Shard 0's hits beyond the 14 it was first asked for belong in the top 20: merged.
    assert _ids(result) == EXACT
    assert result.shards == shard_counts(4, 4)
    assert not result.partial
    # One request per shard for 14, then shard 0 again, for 20, to the replica that
    # answered it; the others never again.
    assert sorted(rig.client.sent[:4]) == [(PORT + s, ASKED) for s in range(4)]
    assert rig.client.sent[4:] == [(PORT, K)]
    assert rig.second_rounds() == (1, 0, 1)
    assert rig.metric("topk_maybe_inexact_total") == 0
    assert rig.metric("shard_requests_total", result="ok") == 5
    # The hits asked of the shards count the first round's (what asking fewer saves).
    assert rig.metric("topk_hits_asked_total") == 4 * ASKED
    # The same hits as every shard asked for k.
    exact = await rig.search(topk_probability=1.0)
    assert _ids(exact) == EXACT
    assert rig.second_rounds() == (1, 0, 1)


async def test_every_flagged_shard_is_asked_again_and_no_other(
    registry: CollectorRegistry,
) -> None:
    rig = Rig(registry)
    # Shards 0 and 1 share the best documents: at 0.5 each is asked for 7, and both
    # sevens make the top 20; shards 2 and 3 rank below, and fill the rest.
    rig.client.documents[PORT] = _ranked(0, [5000.0 - 2 * i for i in range(40)])
    rig.client.documents[PORT + 1] = _ranked(1, [4999.0 - 2 * i for i in range(40)])
    result = await rig.search(topk_probability=0.5)

    assert sorted(rig.client.asked_for_k()) == [PORT, PORT + 1]
    assert _ids(result) == [f"s{i % 2}-{i // 2}" for i in range(K)]
    assert rig.second_rounds() == (1, 0, 2)
    assert rig.metric("topk_maybe_inexact_total") == 0


async def test_a_query_with_no_flagged_shard_has_no_second_round(
    registry: CollectorRegistry,
) -> None:
    rig = Rig(registry)
    # Interleaved over the four shards: each one's 14th ranks below the top 20.
    for s in range(4):
        rig.client.documents[PORT + s] = _ranked(s, [1000.0 - (i * 4 + s) for i in range(40)])
    result = await rig.search()
    assert _ids(result) == [f"s{i % 4}-{i // 4}" for i in range(K)]
    assert rig.client.sent == [(PORT + s, ASKED) for s in range(4)]
    assert rig.second_rounds() == (0, 0, 0)
    assert rig.metric("topk_maybe_inexact_total") == 0


async def test_the_second_request_goes_to_the_replica_that_answered(
    registry: CollectorRegistry,
) -> None:
    rig = Rig(registry)
    rig.client.held.add(PORT + 3)
    task = await rig.start()
    # Shard 0 answered from PORT; the picker would now choose PORT_B among candidates.
    rig.picker.port = PORT_B
    rig.client.release(PORT + 3)
    await _turns()
    assert _ids(task.result()) == EXACT
    assert rig.client.asked_for_k() == [PORT]


async def test_the_second_request_goes_elsewhere_once_that_replica_is_ejected(
    registry: CollectorRegistry,
) -> None:
    rig = Rig(registry)
    rig.client.hold_next.add(PORT + 3)
    task = await rig.start()
    # Shard 0 answered from PORT. Meanwhile, three other queries (asking every shard
    # for K) find PORT failing, and retry on PORT_B: PORT is ejected.
    rig.client.second[PORT] = SubrequestError("connection refused")
    for _ in range(3):
        assert _ids(await rig.search(topk_probability=1.0)) == EXACT
    assert rig.fanout.ejected() == {"ds-0"}
    del rig.client.second[PORT]
    before = len(rig.client.sent)
    rig.client.release(PORT + 3)
    await _turns()
    assert _ids(task.result()) == EXACT
    assert rig.client.sent[before:] == [(PORT_B, K)]


@pytest.mark.parametrize(
    ("answer", "charged"),
    [
        (SubrequestError("connection reset"), "error"),
        ((500, b"{}"), "error"),
        ((503, b""), "overload"),  # a refusal: never a step towards ejection
        # More hits than asked: a bad answer, refused whole.
        ((200, _body(PORT, _ranked(0, [5000.0 - i for i in range(K + 1)]))), "error"),
        # Cut at its budget: not a whole top k, so the first answer stands.
        ((200, _body(PORT, _ranked(0, [5000.0 - i for i in range(K)]), cut=True)), "ok"),
    ],
    ids=["connection", "status", "overload", "too-many-hits", "cut"],
)
async def test_a_second_request_that_fails_keeps_the_first_answer(
    answer: BaseException | tuple[int, bytes], charged: str, registry: CollectorRegistry
) -> None:
    rig = Rig(registry)
    rig.client.second[PORT] = answer
    result = await rig.search()

    # The first round's merge: shard 0 answered (its 14), nothing partial.
    assert _ids(result) == FIRST_ROUND
    assert result.shards == shard_counts(4, 4)
    assert not result.partial
    assert result.coverage is not None
    assert result.coverage.full
    assert rig.second_rounds() == (0, 1, 1)
    assert rig.metric("topk_maybe_inexact_total") == 1
    # Neither retried on shard 0's other replica nor hedged: one request more.
    assert rig.client.asked_for_k() == [PORT]
    assert len(rig.client.sent) == 5
    # Charged as any sub-request's failure or refusal is: one of each at most.
    assert rig.metric("shard_requests_total", result=charged) == (5 if charged == "ok" else 1)
    assert rig.failures(PORT) == (1 if charged == "error" else 0)
    assert rig.fanout.ejected() == set()


async def test_the_deadline_in_the_second_round_returns_the_first_merge(
    registry: CollectorRegistry,
) -> None:
    rig = Rig(registry)
    rig.client.held.add(PORT + 3)
    task = await rig.start()
    assert not await rig.after(task, STEP)
    # Shard 3 answers STEP in; shard 0's second request is then held until the deadline.
    rig.client.held.add(PORT)
    rig.client.release(PORT + 3)
    await _turns()
    assert rig.client.asked_for_k() == [PORT]
    assert not await rig.after(task, 1 - STEP - STEP / 8)
    assert await rig.after(task, STEP / 8)
    result = task.result()

    assert result.took_ms == DEADLINE_MS
    assert _ids(result) == FIRST_ROUND
    assert result.shards == shard_counts(4, 4)
    assert not result.partial
    assert rig.second_rounds() == (0, 1, 1)
    assert rig.metric("topk_maybe_inexact_total") == 1
    # Abandoned as at any deadline: cancelled, and judged as any timeout (one late
    # replica among the query's four shards: an outlier, one step towards ejection).
    assert all(future.cancelled() for future in rig.client.out(PORT))
    assert rig.metric("shard_requests_total", result="timeout") == 1
    assert rig.failures(PORT) == 1


async def test_the_admission_counts_the_second_round_as_the_querys_own_cost(
    registry: CollectorRegistry,
) -> None:
    rig = Rig(registry)
    rig.client.held.add(PORT + 3)
    task = await rig.start()
    await rig.after(task, STEP)
    rig.client.held.add(PORT)
    rig.client.release(PORT + 3)
    await _turns()
    await rig.after(task, STEP)
    rig.client.release(PORT)
    await _turns()
    result = task.result()
    assert _ids(result) == EXACT
    assert result.took_ms == 2 * STEP * 1000
    # A sample of the first round's time: the second's is not queueing.
    assert rig.admission.samples == [STEP]


async def test_no_second_round_when_the_coverage_policy_ended_the_query(
    registry: CollectorRegistry,
) -> None:
    rig = Rig(registry, coverage=CoveragePolicy(0.7, adaptive_wait=1.0))
    rig.client.held.update(PORT + s for s in range(4))
    task = await rig.start()
    assert not await rig.after(task, STEP)
    # 3 of 4 shards (75 %) answered STEP in: shard 3 may take STEP more, no longer.
    for s in range(3):
        rig.client.release(PORT + s)
    await _turns()
    assert not await rig.after(task, STEP - STEP / 8)
    assert await rig.after(task, STEP / 8)
    result = task.result()
    assert result.shards == shard_counts(4, 3, timed_out=1)
    assert result.coverage is not None
    assert result.coverage.degraded == ("adaptive_wait",)
    # Shard 0 is flagged, but the query was let go early: no second round.
    assert rig.client.asked_for_k() == []
    assert _ids(result)[:ASKED] == EXACT[:ASKED]
    assert rig.second_rounds() == (0, 0, 0)
    assert rig.metric("topk_maybe_inexact_total") == 1


async def test_no_second_round_when_every_shard_was_asked_for_k(
    registry: CollectorRegistry,
) -> None:
    rig = Rig(registry)
    result = await rig.search(topk_probability=1.0)
    assert _ids(result) == EXACT
    assert rig.client.sent == [(PORT + s, K) for s in range(4)]
    assert rig.second_rounds() == (0, 0, 0)
    assert rig.metric("topk_maybe_inexact_total") == 0


async def test_turned_off_a_flagged_query_is_counted_as_before(
    registry: CollectorRegistry,
) -> None:
    rig = Rig(registry, topk_second_round=False)
    result = await rig.search()
    assert _ids(result) == FIRST_ROUND
    assert rig.client.sent == [(PORT + s, ASKED) for s in range(4)]
    assert rig.second_rounds() == (0, 0, 0)
    assert rig.metric("topk_maybe_inexact_total") == 1
    assert FanOutConfig().topk_second_round is True


# -- configuration ----------------------------------------------------------------------


def test_the_flag_its_variable_and_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def parse(argv: list[str]) -> SearchServerConfig:
        return SearchServerConfig.from_args(build_parser().parse_args(argv))

    monkeypatch.delenv("DISCOVERY_TOPK_SECOND_ROUND", raising=False)
    assert parse([]).topk_second_round is True
    assert parse(["--no-topk-second-round"]).topk_second_round is False
    assert parse(["--topk-second-round"]).topk_second_round is True
    monkeypatch.setenv("DISCOVERY_TOPK_SECOND_ROUND", "off")
    assert parse([]).topk_second_round is False
    assert parse(["--topk-second-round"]).topk_second_round is True  # the flag wins
    monkeypatch.setenv("DISCOVERY_TOPK_SECOND_ROUND", "sometimes")
    with pytest.raises(SystemExit):
        build_parser()
    assert "DISCOVERY_TOPK_SECOND_ROUND='sometimes'" in capsys.readouterr().err
    monkeypatch.delenv("DISCOVERY_TOPK_SECOND_ROUND")
    assert "DISCOVERY_TOPK_SECOND_ROUND" in build_parser().format_help()
