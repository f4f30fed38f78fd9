"""The chaos harness's own logic: the seeded schedule, the convergence test, the verdict.

The run itself (``make chaos-ci``, called by ``.ci/run``) starts real processes for
minutes; these tests pin down the parts that decide what a run means.
"""

from __future__ import annotations

import argparse

import pytest

from discovery.errors import ConfigError
from discovery.tools.chaos import ChaosConfig, ChaosResult, schedule
from discovery.tools.chaos.faults import CATEGORIES, FAULTS, StepResult
from discovery.tools.chaos.load import LoadStats
from discovery.tools.chaos.observer import Snapshot, Violation
from discovery.tools.chaos.report import render, to_json
from discovery.tools.main import build_parser


def test_schedule_is_seeded_and_meets_every_kind_in_each_round() -> None:
    assert schedule(7) == schedule(7)
    assert schedule(7) != schedule(8)
    kinds = len(FAULTS)
    first_rounds = schedule(7)[: 3 * kinds]
    for start in range(0, len(first_rounds), kinds):
        assert sorted(first_rounds[start : start + kinds]) == sorted(FAULTS)


def test_schedule_takes_the_categories_in_turn_so_a_short_run_meets_each() -> None:
    category = {kind: name for name, kinds in CATEGORIES.items() for kind in kinds}
    assert set(category) == set(FAULTS)
    for seed in range(20):
        assert {category[kind] for kind in schedule(seed)[:3]} == set(CATEGORIES)
    without = schedule(7, partitions=False)
    assert not any(category[kind] == "partition" for kind in without)
    others = sorted(kind for kind in FAULTS if category[kind] != "partition")
    assert sorted(without[: len(others)]) == others


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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--data-servers", "4", "--shards", "8"], "--data-servers (4) must be at least --shards"),
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
