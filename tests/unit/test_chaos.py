"""The chaos harness's own logic: the seeded schedule, the convergence test, the verdict.

The run itself (``make chaos-ci``, called by ``.ci/run``) starts real processes for
minutes; these tests pin down the parts that decide what a run means.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from collections import Counter
from types import SimpleNamespace

import pytest

from discovery.errors import ConfigError
from discovery.tools.chaos import ChaosConfig, ChaosResult, schedule
from discovery.tools.chaos import command as chaos_command
from discovery.tools.chaos.context import FaultContext
from discovery.tools.chaos.deploy import DeployFigures, deploy_batches
from discovery.tools.chaos.ensemble import WHOLE_STEP, _supervise, ensemble_whole
from discovery.tools.chaos.faults import CATEGORIES, FAULTS, SENTINEL_KINDS, StepResult, kinds
from discovery.tools.chaos.load import LoadStats
from discovery.tools.chaos.observer import Observer, Snapshot, Violation
from discovery.tools.chaos.report import render, to_json
from discovery.tools.chaos.runner import resolve_kinds
from discovery.tools.main import build_parser


def _mode_kinds(*, sentinels: bool, partitions: bool = True) -> list[str]:
    return sorted(
        kind
        for name in CATEGORIES
        if partitions or name != "partition"
        for kind in kinds(name, sentinels=sentinels)
    )


@pytest.mark.parametrize("sentinels", [False, True])
def test_schedule_is_seeded_and_meets_every_kind_in_each_round(sentinels: bool) -> None:
    assert schedule(7, sentinels=sentinels) == schedule(7, sentinels=sentinels)
    assert schedule(7, sentinels=sentinels) != schedule(8, sentinels=sentinels)
    every = _mode_kinds(sentinels=sentinels)
    assert len(every) == 35  # 11 process, 6 partition, 4 overlap, 3 backend, 10 hostile, 1 deploy
    first_rounds = schedule(7, sentinels=sentinels)[: 3 * len(every)]
    for start in range(0, len(first_rounds), len(every)):
        assert sorted(first_rounds[start : start + len(every)]) == every
        # The rolling restart, a minute or two, ends each round.
        assert first_rounds[start + len(every) - 1] == "deploy_day"


def test_schedule_takes_the_categories_in_turn_so_a_short_run_meets_each() -> None:
    category = {kind: name for name, pool in CATEGORIES.items() for kind in pool}
    assert set(category) == set(FAULTS)
    # Every category but the deploy day, which ends each round instead.
    turned = set(CATEGORIES) - {"deploy"}
    for seed in range(20):
        for sentinels in (False, True):
            first = schedule(seed, sentinels=sentinels)[: len(turned)]
            assert {category[kind] for kind in first} == turned
            assert category[first[-1]] == "hostile"  # the last of each turn
    for sentinels in (False, True):
        without = schedule(7, partitions=False, sentinels=sentinels)
        assert not any(category[kind] == "partition" for kind in without)
        others = _mode_kinds(sentinels=sentinels, partitions=False)
        assert sorted(without[: len(others)]) == others


def test_single_redis_schedules_are_unchanged_by_the_sentinel_and_hostile_kinds() -> None:
    # Seed 7's first round (make chaos-ci) since the backend category came (issue 23):
    # adding kinds for the other mode must not reshuffle a single-Redis run, and the
    # hostile kinds, drawn from a generator of their own, only come in between.
    hostile = set(CATEGORIES["hostile"])
    assert [kind for kind in schedule(7) if kind not in hostile][:6] == [
        "zk_disk_full",
        "data_server_slow",
        "partition_leader_redis",
        "overlap_zk_kill_during_leader_kill",
        "zk_leader_pause",
        "redis_restart",
    ]


def test_the_deploy_day_leaves_the_other_kinds_order_as_it_was() -> None:
    # Drawn from no generator: taking it out gives the schedule the seed gave before.
    for seed in (3, 7):
        for sentinels in (False, True):
            order = schedule(seed, sentinels=sentinels)
            hostile = set(CATEGORIES["hostile"])
            others = [kind for kind in order if kind != "deploy_day" and kind not in hostile]
            rounds = len(order) // len(_mode_kinds(sentinels=sentinels))
            assert order.count("deploy_day") == rounds
            assert "deploy_day" not in order[:20]
            assert others[:6] == [k for k in order if k not in hostile and k != "deploy_day"][:6]
    assert schedule(3, only=resolve_kinds(["deploy"]))[:2] == ["deploy_day", "deploy_day"]


def _shards_down(batches: list[list[str]], shard_of: dict[str, int]) -> list[int]:
    """The shards some batch takes down entirely."""
    replicas = Counter(shard_of.values())
    return [
        shard
        for batch in batches
        for shard, count in Counter(shard_of[name] for name in batch).items()
        if count == replicas[shard]
    ]


@pytest.mark.parametrize(
    ("servers", "shards", "size"),
    [(30, 15, 3), (12, 6, 1), (100, 50, 10), (9, 4, 4), (20, 5, 8), (7, 3, 2)],
)
def test_deploy_batches_hold_every_server_once_and_leave_each_shard_a_replica(
    servers: int, shards: int, size: int
) -> None:
    # The chaos cluster's layout: server i serves shard i % shards.
    shard_of = {f"ds-{i:04d}": i % shards for i in range(servers)}
    batches = deploy_batches(sorted(shard_of.items()), size)
    assert sorted(name for batch in batches for name in batch) == sorted(shard_of)
    assert all(1 <= len(batch) <= size for batch in batches)
    assert _shards_down(batches, shard_of) == []
    # As few batches as the size allows (the replicas spread over them).
    assert len(batches) == -(-servers // size)


def test_deploy_batches_take_down_only_a_shard_that_has_a_single_replica() -> None:
    shard_of = {"a": 0, "b": 0, "c": 1, "d": 2, "e": 2}
    batches = deploy_batches(sorted(shard_of.items()), 5)
    assert sorted(name for batch in batches for name in batch) == sorted(shard_of)
    assert _shards_down(batches, shard_of) == [1]  # unavoidable, and only that one
    with pytest.raises(ValueError, match="at least 1"):
        deploy_batches([("a", 0)], 0)


def test_deploy_outcome_fails_on_any_failed_query_or_one_percent_partial() -> None:
    assert DeployFigures(sent=1000, complete=991, partial=9).problems() == []
    assert DeployFigures(sent=1000, complete=990, partial=10).problems() == [
        "10 of 1000 answers partial (1.00 %, limit 1 %)"
    ]
    assert DeployFigures(sent=500, complete=499, failed=1).problems() == ["1 of 500 queries failed"]
    assert DeployFigures(sent=10, complete=10, disturbed=1).problems() == [
        "1 queries disturbed by the harness (not judged)"
    ]
    assert DeployFigures().problems() == ["no query was sent during the deploy, nothing was judged"]


def test_sentinel_mode_fails_redis_over_and_never_restarts_it_empty() -> None:
    for seed in range(20):
        for partitions in (True, False):
            single = schedule(seed, partitions=partitions)
            with_sentinels = schedule(seed, partitions=partitions, sentinels=True)
            assert "redis_failover" in with_sentinels
            assert "overlap_redis_failover_during_leader_change" in with_sentinels
            assert not set(SENTINEL_KINDS) & set(with_sentinels)
            assert not set(SENTINEL_KINDS.values()) & set(single)
            # The same seed, the same run: the failovers take the restarts' places.
            assert with_sentinels == [SENTINEL_KINDS.get(kind, kind) for kind in single]
    assert CATEGORIES["process"].count("redis_failover") == 1


def test_kinds_runs_only_the_named_kinds_and_categories_in_the_seeds_order() -> None:
    hostile = resolve_kinds(["hostile"])
    assert hostile == set(CATEGORIES["hostile"])
    assert (
        schedule(7, only=hostile)[:6]
        == [kind for kind in schedule(7) if kind in CATEGORIES["hostile"]][:6]
    )
    picked = resolve_kinds(["hostile_trickle", "leader_kill"])
    assert set(schedule(3, only=picked)) == {"hostile_trickle", "leader_kill"}
    assert resolve_kinds([]) is None  # every kind
    # A category holds only what the run's mode schedules.
    assert "redis_failover" not in (resolve_kinds(["process"]) or set())
    assert "redis_restart" not in (resolve_kinds(["process"], sentinels=True) or set())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kinds", "hostile,bogus"], "--kinds: 'bogus' is neither a fault kind nor a category"),
        (["--kinds", "redis_failover"], "--kinds: redis_failover does not run in this mode"),
        (["--kinds", "partition", "--no-partitions"], "--kinds: no kind of partition runs"),
        (["--kinds", "partition_leader_redis", "--no-partitions"], "does not run in this mode"),
    ],
)
def test_kinds_that_cannot_run_are_refused_before_anything_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse_chaos_args([*argv, "--no-partitions"] if "--no-partitions" not in argv else argv)
    assert chaos_command.run(args) == 2
    assert message in capsys.readouterr().err


def test_kinds_flag_is_a_comma_separated_list() -> None:
    assert parse_chaos_args(["--kinds", "hostile, leader_kill"]).kinds == ["hostile", "leader_kill"]
    assert parse_chaos_args([]).kinds == []
    with pytest.raises(SystemExit):
        parse_chaos_args(["--kinds", ","])


def _snapshot(**views: object) -> Snapshot:
    model = frozenset({"a", "b"})
    fields: dict[str, object] = {
        "at": 1.0,
        "model": model,
        "zk": model,
        "redis": model,
        "redis_epoch": 5,
        "search": {"s1": model, "s2": model},
    }
    fields.update(views)
    return Snapshot(**fields)  # type: ignore[arg-type]


def test_converged_only_when_every_view_equals_the_model() -> None:
    assert _snapshot().converged
    assert not _snapshot(zk=frozenset({"a"})).converged
    assert not _snapshot(redis=None).converged  # Redis unreadable is not agreement
    assert not _snapshot(search={"s1": frozenset({"a", "b", "c"})}).converged
    assert not _snapshot(search={}).converged  # nobody routing proves nothing
    detail = _snapshot(search={"s1": frozenset({"a", "c"})}).describe()
    assert "s1: missing ['b'] extra ['c']" in detail


def test_search_follows_redis_only_when_every_server_holds_its_epoch() -> None:
    assert _snapshot(epochs={"s1": 5, "s2": 5}).search_follows_redis
    assert not _snapshot(epochs={"s1": 5, "s2": 4}).search_follows_redis  # not reloaded yet
    assert not _snapshot(redis=None, redis_epoch=None, epochs={"s1": 5}).search_follows_redis


def test_a_working_cluster_has_one_leader_whose_heartbeat_is_newer_than_the_fault() -> None:
    ended = 1_000_000.0
    assert _snapshot(leaders=["s1"], heartbeat_ms=ended + 400).leading_since(ended)
    # A right list is not enough: nobody in office could publish the next change.
    assert not _snapshot(leaders=[], heartbeat_ms=ended + 400).leading_since(ended)
    assert not _snapshot(leaders=["s1", "s2"], heartbeat_ms=ended + 1).leading_since(ended)
    # A heartbeat from before the fault ended says nothing about now.
    assert not _snapshot(leaders=["s1"], heartbeat_ms=ended - 1).leading_since(ended)
    assert not _snapshot(leaders=["s1"], heartbeat_ms=None).leading_since(ended)


def _result(violations: list[Violation]) -> ChaosResult:
    result = ChaosResult(
        ChaosConfig(duration=10, seed=3, partitions=False), started=True, elapsed=12.0
    )
    result.faults_run = ["data_server_kill", "redis_flushall"]
    result.steps = [
        StepResult("data_server_kill", "removed", 6.0, 4.5),
        StepResult("redis_flushall", "republished", 7.0, None, "redis: unavailable"),
    ]
    result.load = LoadStats(sent=3, complete=3, latencies_ms=[10.0, 20.0, 30.0])
    result.violations = violations
    return result


def test_report_passes_only_without_violations() -> None:
    assert render(_result([])).endswith("RESULT: PASS")
    violation = Violation("epoch never decreases", 4.2, "leader_pause", "epoch 3 after 4")
    text = render(_result([violation]))
    assert text.endswith("RESULT: FAIL")
    assert "epoch never decreases" in text
    assert "1 VIOLATED" in text
    record = to_json(_result([violation]))
    assert record["ok"] is False
    assert record["faults"]["leader_pause"]["violations"] == 1
    assert record["faults"]["redis_flushall"]["worst_s"] == float("inf")  # never converged


def test_a_run_that_never_started_is_not_a_pass() -> None:
    result = ChaosResult(ChaosConfig(partitions=False), started=False, setup_error="zk down")
    assert not result.ok
    assert "SETUP FAILED: zk down" in render(result)


def parse_chaos_args(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["chaos", *argv])


def test_a_sentinel_run_is_reported_as_one() -> None:
    result = _result([])
    result.config = ChaosConfig(duration=10, seed=3, partitions=False, redis_sentinels=3)
    longest = "overlap_redis_failover_during_leader_change"
    result.faults_run += ["redis_failover", longest]
    result.steps += [
        StepResult("redis_failover", "failed over", 5.0, 3.1),
        StepResult(longest, "new leader, readers back", 11.1, 5.0),
    ]
    text = render(result)
    assert "Redis primary + 2 replicas + 3 sentinels" in text
    assert "redis_failover" in text
    assert "3.10 s (62% of bound)" in text
    # The columns stay aligned with the longest kind's name in the table.
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("fault "))
    count_end = header.index("count") + len("count")
    for kind in ("redis_failover", longest, "data_server_kill"):
        row = next(line for line in lines if line.startswith(kind + " "))
        assert row[:count_end].endswith(" 1"), row
    record = to_json(result)
    assert record["config"]["redis_sentinels"] == 3
    assert record["faults"]["redis_failover"]["count"] == 1


def test_failover_bound_is_down_after_plus_target_plus_slack() -> None:
    config = ChaosConfig(partitions=False, redis_sentinels=3)
    assert config.sentinel_mode
    assert not ChaosConfig(partitions=False).sentinel_mode
    # 2 s down-after + 3 s target + 0.5 s heartbeat + 0.5 s reconnect back-off.
    assert config.redis_failover_bound == pytest.approx(6.0)
    args = parse_chaos_args(["--redis-sentinels", "3", "--no-partitions"])
    assert ChaosConfig.from_args(args).redis_sentinels == 3
    assert ChaosConfig.from_args(parse_chaos_args(["--no-partitions"])).redis_sentinels == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--data-servers", "4", "--shards", "8"], "--data-servers (4) must be at least --shards"),
        (["--redis-sentinels", "-1", "--no-partitions"], "--redis-sentinels must be 0"),
        (["--search-servers", "1"], None),  # refused by argparse: 2..9
    ],
)
def test_bad_flags_are_refused_with_the_flag_named(argv: list[str], message: str | None) -> None:
    if message is None:
        with pytest.raises(SystemExit):
            parse_chaos_args(argv)
        return
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ChaosConfig.from_args(parse_chaos_args(argv))


def test_a_read_older_than_a_newer_publish_is_not_an_epoch_going_back() -> None:
    """A sample's read of ``P:meta`` (epoch 313) is answered before the new leader's
    publish (314), but the stream's entry for 314 is handled first: not a violation.
    The same read sent after 314 was seen is one."""
    observer = Observer(SimpleNamespace(data={}))  # type: ignore[arg-type]
    observer._check_epoch(313, "P:meta")
    floor = observer.max_epoch  # the sample sends its reads
    observer._check_epoch(314, "change from 'ss-1'", 313)  # the stream, meanwhile
    observer._check_epoch(313, "P:meta", floor)  # the sample's reply, sent before 314
    assert observer.violations == []
    assert observer.max_epoch == 314
    observer._check_epoch(313, "P:meta", observer.max_epoch)  # sent after 314 was seen
    assert [v.invariant for v in observer.violations] == ["epoch never decreases"]
    assert observer.max_epoch == 314


class _AdminRecorder:
    """Stands in for the cluster's ``/admin`` calls: records each fault body sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, object]]] = []

    async def admin(self, member: SimpleNamespace, path: str, body: dict[str, object]) -> None:
        assert path == "fault"
        self.sent.append((member.name, body))


def _context(cluster: _AdminRecorder, model: set[str]) -> FaultContext:
    observer = SimpleNamespace(model=model)
    return FaultContext(cluster, observer, ChaosConfig(partitions=False), random.Random(1))  # type: ignore[arg-type]


def test_probes_fail_for_the_block_and_pass_again_however_it_ends() -> None:
    cluster = _AdminRecorder()
    model = {"data-1", "data-2", "data-3"}
    ctx = _context(cluster, model)
    victims = [SimpleNamespace(name="data-1"), SimpleNamespace(name="data-2")]

    async def harness_bug_midway() -> None:
        async with ctx.probes_failing(victims):  # type: ignore[arg-type]
            assert model == {"data-3"}
            raise RuntimeError("a harness bug")

    with pytest.raises(RuntimeError, match="a harness bug"):
        asyncio.run(harness_bug_midway())
    assert model == {"data-1", "data-2", "data-3"}
    assert cluster.sent == [
        ("data-1", {"mode": "error", "rate": 1.0}),
        ("data-2", {"mode": "error", "rate": 1.0}),
        ("data-1", {"mode": "none"}),
        ("data-2", {"mode": "none"}),
    ]

    async def slow_probes() -> None:
        async with ctx.probes_failing(victims[:1], {"mode": "slow", "delay": 2.0}):  # type: ignore[arg-type]
            assert model == {"data-2", "data-3"}

    cluster.sent.clear()
    asyncio.run(slow_probes())
    assert model == {"data-1", "data-2", "data-3"}
    assert cluster.sent == [
        ("data-1", {"mode": "slow", "delay": 2.0}),
        ("data-1", {"mode": "none"}),
    ]


class _ExitingZooKeeper:
    """A ZooKeeper server whose disk was full: not serving, still running for ``polls``
    looks (the JVM on its way out, status 10), then exited; serves once started again."""

    def __init__(self, server_id: int, polls: int) -> None:
        self.server_id = server_id
        self._polls = polls
        self.starts = 0

    def mode(self) -> str | None:
        self._polls -= 1
        return "follower" if self.starts else None

    @property
    def running(self) -> bool:
        return self.starts > 0 or self._polls > 0


def test_a_zookeeper_server_that_exits_after_its_disk_is_freed_is_started_again() -> None:
    late, serving = _ExitingZooKeeper(2, polls=3), _ExitingZooKeeper(1, polls=0)
    serving.starts = 1  # never filled its disk to the point of exiting
    started: list[int] = []

    def start_zookeeper(index: int, *, wait: bool) -> None:
        assert not wait
        started.append(index)
        servers[index].starts += 1

    servers = [serving, late]
    cluster = SimpleNamespace(
        backend=SimpleNamespace(zk=SimpleNamespace(servers=servers)),
        start_zookeeper=start_zookeeper,
    )
    assert asyncio.run(_supervise(cluster, [0, 1], timeout=10.0)) == []  # type: ignore[arg-type]
    assert started == [1]
    assert late.mode() == "follower"

    stuck = _ExitingZooKeeper(3, polls=10**6)  # never exits, never serves
    servers[:] = [stuck]
    assert asyncio.run(_supervise(cluster, [0], timeout=0.5)) == [0]  # type: ignore[arg-type]
    assert started == [1]


class _HealingZooKeeper:
    """A ZooKeeper server that serves from its ``serves_at``-th look on (never: None)."""

    def __init__(self, server_id: int, serves_at: int | None) -> None:
        self.server_id = server_id
        self.serves_at = serves_at
        self.looks = 0

    def mode(self) -> str | None:
        self.looks += 1
        serving = self.serves_at is not None and self.looks >= self.serves_at
        return "follower" if serving else None


def test_the_next_fault_waits_for_every_zookeeper_server_to_serve() -> None:
    # The soak's case: the quorum served the clients, one server was stuck for 20 s.
    servers = [_HealingZooKeeper(1, 1), _HealingZooKeeper(2, 1), _HealingZooKeeper(3, 4)]
    violations: list[tuple[str, str]] = []
    cluster = SimpleNamespace(backend=SimpleNamespace(zk=SimpleNamespace(servers=servers)))
    observer = SimpleNamespace(
        violate=lambda invariant, detail: violations.append((invariant, detail))
    )
    ctx = FaultContext(cluster, observer, ChaosConfig(partitions=False), random.Random(1))  # type: ignore[arg-type]

    took = asyncio.run(ensemble_whole(ctx, "zk_quorum_loss", timeout=10.0))
    assert took is not None
    assert servers[2].looks == 4  # waited for the stuck one, not judged at the first look
    assert violations == []
    assert [(r.fault, r.step, r.took) for r in ctx.results] == [
        ("zk_quorum_loss", WHOLE_STEP, took)
    ]

    servers[2] = _HealingZooKeeper(3, None)  # never serves again
    assert asyncio.run(ensemble_whole(ctx, "zk_server_kill", timeout=0.5)) is None
    assert violations == [
        (
            "fault healed",
            "zk_server_kill: ZooKeeper server(s) [3] not serving 0.5 s after the fault",
        )
    ]
    assert ctx.results[-1].took is None
