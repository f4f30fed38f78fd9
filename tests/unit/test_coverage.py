"""The coverage policy as pure decisions: documents and times in, when and why to stop.

Also its settings: the frozen policy's checks, a query's own parameters
(:func:`~search_server.coverage.parse_coverage`) and the search server's flags.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from discovery.errors import BadRequestError
from search_server import cli as search_server_cli
from search_server.config import SearchServerConfig
from search_server.config import build_parser as build_search_parser
from search_server.coverage import (
    EARLY_END_RULES,
    CoveragePolicy,
    CoverageWait,
    EarlyEnd,
    late_shards,
    parse_coverage,
)
from search_server.merging import DEGRADED_REASONS, FailureReason, Ranked, ShardOutcome, merge

START, DEADLINE = 10.0, 11.0  # a query of 1 s, on its timer
ENV = ("DISCOVERY_MIN_COVERAGE", "DISCOVERY_SOFT_TIMEOUT", "DISCOVERY_ADAPTIVE_WAIT")


def wait_of(
    policy: CoveragePolicy, *, docs_total: int = 20_000, shards_total: int = 20
) -> CoverageWait:
    return CoverageWait(
        policy, started=START, deadline=DEADLINE, docs_total=docs_total, shards_total=shards_total
    )


def answer(wait: CoverageWait, count: int, now: float, docs: int = 1000) -> list[EarlyEnd | None]:
    """``count`` shards of ``docs`` documents (each counted for that much) answer at ``now``."""
    return [wait.answered(docs, docs, now) for _ in range(count)]


# -- the policy -----------------------------------------------------------------------


def test_the_default_policy_is_off_waiting_for_every_shard() -> None:
    policy = CoveragePolicy()
    assert (policy.min_coverage, policy.soft_timeout, policy.adaptive_wait) == (1.0, 0.0, 1.0)
    assert not policy.active
    # At 100 % no rule can stop a query early, whatever the others say.
    assert not CoveragePolicy(1.0, soft_timeout=0.5, adaptive_wait=2).active
    # Below it, a rule is needed to stop by.
    assert not CoveragePolicy(0.9, soft_timeout=0, adaptive_wait=0).active
    assert CoveragePolicy(0.9).active
    assert CoveragePolicy(0.9, soft_timeout=0.5, adaptive_wait=0).active


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"min_coverage": 0.0}, "min_coverage"),
        ({"min_coverage": -0.5}, "min_coverage"),
        ({"min_coverage": 1.01}, "min_coverage"),
        ({"min_coverage": math.nan}, "min_coverage"),
        ({"soft_timeout": -0.1}, "soft_timeout"),
        ({"soft_timeout": 1.5}, "soft_timeout"),
        ({"soft_timeout": math.nan}, "soft_timeout"),
        ({"adaptive_wait": -1.0}, "adaptive_wait"),
        ({"adaptive_wait": 1001.0}, "adaptive_wait"),
        ({"adaptive_wait": math.inf}, "adaptive_wait"),
        ({"adaptive_wait": math.nan}, "adaptive_wait"),
    ],
)
def test_a_value_out_of_range_is_refused_naming_its_field(
    fields: dict[str, float], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        CoveragePolicy(**fields)


def test_the_rules_are_the_last_degraded_reasons_after_the_faults() -> None:
    assert DEGRADED_REASONS[-2:] == EARLY_END_RULES == ("soft_timeout", "adaptive_wait")
    assert DEGRADED_REASONS[:5] == ("no_replica", "deadline", "overload", "error", "cut")


# -- the decision ---------------------------------------------------------------------


def test_the_adaptive_wait_is_a_multiple_of_the_time_the_coverage_took() -> None:
    wait = wait_of(CoveragePolicy(0.95, adaptive_wait=1.5))
    assert answer(wait, 18, 10.1) == [None] * 18
    assert wait.reached_at is None
    assert wait.end is None
    # The 19th of 20 equal shards makes 95 %, 0.2 s after the start: 0.3 s more.
    end = wait.answered(1000, 1000, 10.2)
    assert end is not None
    assert end.rule == "adaptive_wait"
    assert end.at == pytest.approx(10.5)
    assert wait.reached_at == 10.2
    assert wait.ratio == pytest.approx(0.95)
    # The end is set once: a later answer moves nothing.
    assert wait.answered(1000, 1000, 10.3) is None
    assert wait.end == end


def test_the_soft_timeout_ends_at_its_share_of_the_budget_or_at_once_past_it() -> None:
    early = wait_of(CoveragePolicy(0.95, soft_timeout=0.5, adaptive_wait=0))
    assert answer(early, 19, 10.1)[-1] == EarlyEnd(10.5, "soft_timeout")

    late = wait_of(CoveragePolicy(0.95, soft_timeout=0.5, adaptive_wait=0))
    # Past the soft timeout but short of the coverage: nothing yet.
    assert answer(late, 18, 10.7) == [None] * 18
    # The coverage reached after it: end now.
    assert late.answered(1000, 1000, 10.8) == EarlyEnd(10.8, "soft_timeout")


@pytest.mark.parametrize(
    ("reached", "expected"),
    [
        (10.1, EarlyEnd(10.2, "adaptive_wait")),  # 0.1 s more, before the soft 10.5
        (10.3, EarlyEnd(10.5, "soft_timeout")),  # 0.3 s more would be after it
        (10.25, EarlyEnd(10.5, "soft_timeout")),  # a tie: the soft timeout names it
    ],
)
def test_whichever_rule_fires_first_ends_the_query(reached: float, expected: EarlyEnd) -> None:
    wait = wait_of(CoveragePolicy(0.95, soft_timeout=0.5, adaptive_wait=1.0))
    end = answer(wait, 19, reached)[-1]
    assert end is not None
    assert end.rule == expected.rule
    assert end.at == pytest.approx(expected.at)


def test_no_early_end_when_the_rules_fire_after_the_deadline() -> None:
    wait = wait_of(CoveragePolicy(0.95, soft_timeout=0, adaptive_wait=1.0))
    # Reached 0.6 s in: 0.6 s more would be 0.2 s past the deadline, which ends it.
    assert answer(wait, 19, 10.6) == [None] * 19
    assert wait.reached_at == 10.6
    assert wait.end is None


def test_below_the_minimum_nothing_ends_early_and_missing_shards_count() -> None:
    # 20 shards asked and 2 missing (no replica): 22,000 documents in all.
    wait = wait_of(CoveragePolicy(0.9, soft_timeout=0.1), docs_total=22_000, shards_total=22)
    assert answer(wait, 19, 10.5) == [None] * 19  # 19/22 = 86 %
    assert wait.reached_at is None
    assert wait.answered(1000, 1000, 10.6) == EarlyEnd(10.6, "soft_timeout")  # 20/22 = 91 %


def test_a_replica_holding_more_than_its_shard_counted_grows_the_total() -> None:
    wait = wait_of(CoveragePolicy(0.95), docs_total=4000, shards_total=4)
    wait.answered(3000, 1000, 10.1)  # 3000 of 6000, as the answer's coverage counts it
    assert wait.ratio == 0.5


def test_without_documents_the_coverage_goes_by_shards() -> None:
    wait = wait_of(CoveragePolicy(0.75), docs_total=0, shards_total=4)
    assert answer(wait, 2, 10.1, docs=0) == [None, None]
    assert wait.ratio == 0.5
    end = wait.answered(0, 0, 10.2)  # 3 of 4 shards, 0.2 s in
    assert end is not None
    assert (end.at, end.rule) == (pytest.approx(10.4), "adaptive_wait")


@dataclass
class _Shard:
    """A shard's part of a query, as :func:`merge` reads it."""

    shard_docs: int
    docs: int = 0
    hits: list[Ranked] | None = None
    outcome: ShardOutcome = "timed_out"
    reason: FailureReason = "error"
    cut: bool = False


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5000), st.integers(0, 8000), st.booleans()),
        min_size=1,
        max_size=30,
    ),
    st.lists(st.integers(0, 5000), max_size=3),
)
def test_the_ratio_is_the_answers_coverage_at_every_answer_and_never_falls(
    shards: list[tuple[int, int, bool]], missing: list[int]
) -> None:
    parts = [_Shard(shard_docs) for shard_docs, _, _ in shards]
    gone = [(1000 + i, docs) for i, docs in enumerate(missing)]
    wait = wait_of(
        CoveragePolicy(1.0),
        docs_total=sum(p.shard_docs for p in parts) + sum(missing),
        shards_total=len(parts) + len(missing),
    )
    last = wait.ratio
    for part, (_, docs, answers) in zip(parts, shards, strict=True):
        if not answers:
            continue
        part.hits, part.docs, part.outcome = [], docs, "ok"
        wait.answered(docs, part.shard_docs, 10.1)
        coverage = merge(parts, 10, 1.0, gone).coverage
        assert coverage is not None
        assert wait.ratio == pytest.approx(coverage.ratio)
        assert wait.ratio >= last - 1e-12
        last = wait.ratio


# -- what the rest of the search server reads of an answer ---------------------------


def test_shards_let_go_are_not_late_for_the_deadline() -> None:
    parts = [_Shard(1000, 1000, [], "ok"), _Shard(1000)]
    assert late_shards(merge(parts, 10, 1.0)) == 1
    let_go = merge(parts, 10, 1.0, timed_out_reason="adaptive_wait")
    assert let_go.shards["timed_out"] == 1
    assert let_go.coverage is not None
    assert let_go.coverage.degraded == ("adaptive_wait",)
    assert late_shards(let_go) == 0


# -- a query's own parameters ---------------------------------------------------------


def test_no_parameter_keeps_the_default() -> None:
    default = CoveragePolicy(0.9, soft_timeout=0.2, adaptive_wait=3)
    assert parse_coverage({"q": "a", "k": "5"}, default) is default


def test_each_parameter_overrides_its_field_alone() -> None:
    default = CoveragePolicy(0.9, soft_timeout=0.2, adaptive_wait=3)
    assert parse_coverage({"min_coverage": "95"}, default) == CoveragePolicy(0.95, 0.2, 3)
    assert parse_coverage({"soft_timeout": "0.5"}, default) == CoveragePolicy(0.9, 0.5, 3)
    assert parse_coverage({"adaptive_wait": "0"}, default) == CoveragePolicy(0.9, 0.2, 0)
    assert parse_coverage(
        {"min_coverage": "100", "soft_timeout": "0", "adaptive_wait": ".5"}, default
    ) == CoveragePolicy(1.0, 0.0, 0.5)


@pytest.mark.parametrize(
    ("params", "named", "reason"),
    [
        ({"min_coverage": "0"}, "min_coverage", "out_of_range"),
        ({"min_coverage": "-5"}, "min_coverage", "out_of_range"),
        ({"min_coverage": "100.5"}, "min_coverage", "out_of_range"),
        ({"min_coverage": "ninety"}, "min_coverage", "not_number"),
        ({"min_coverage": "nan"}, "min_coverage", "not_number"),
        ({"soft_timeout": "1.5"}, "soft_timeout", "out_of_range"),
        ({"soft_timeout": "-0.1"}, "soft_timeout", "out_of_range"),
        ({"soft_timeout": "1e-3"}, "soft_timeout", "not_number"),
        ({"adaptive_wait": "-1"}, "adaptive_wait", "out_of_range"),
        ({"adaptive_wait": "1001"}, "adaptive_wait", "out_of_range"),
        ({"adaptive_wait": "inf"}, "adaptive_wait", "not_number"),
        # Checked in order: the first bad one is named.
        ({"min_coverage": "0", "adaptive_wait": "x"}, "min_coverage", "out_of_range"),
    ],
)
def test_a_bad_parameter_is_refused_naming_it(
    params: dict[str, str], named: str, reason: str
) -> None:
    with pytest.raises(BadRequestError) as refused:
        parse_coverage(params, CoveragePolicy())
    assert (refused.value.parameter, refused.value.reason) == (named, reason)
    assert f"'{named}'" in str(refused.value)


# -- the search server's flags --------------------------------------------------------


@pytest.fixture
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def search_config(*argv: str) -> SearchServerConfig:
    return SearchServerConfig.from_args(build_search_parser().parse_args(list(argv)))


@pytest.mark.usefixtures("_clean_env")
def test_the_flags_default_to_the_policy_off() -> None:
    assert search_config().coverage == CoveragePolicy()


@pytest.mark.usefixtures("_clean_env")
def test_flags_and_environment_make_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    config = search_config("--min-coverage", "95", "--soft-timeout", "0.5", "--adaptive-wait", "2")
    assert config.coverage == CoveragePolicy(0.95, soft_timeout=0.5, adaptive_wait=2.0)
    monkeypatch.setenv("DISCOVERY_MIN_COVERAGE", "99.5")
    monkeypatch.setenv("DISCOVERY_SOFT_TIMEOUT", "0.25")
    monkeypatch.setenv("DISCOVERY_ADAPTIVE_WAIT", "0")
    assert search_config().coverage == CoveragePolicy(0.995, soft_timeout=0.25, adaptive_wait=0)
    assert search_config("--min-coverage", "90").coverage.min_coverage == 0.9  # the flag wins


@pytest.mark.usefixtures("_clean_env")
@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--min-coverage", "0"], "--min-coverage"),
        (["--min-coverage", "101"], "--min-coverage"),
        (["--min-coverage", "most"], "--min-coverage"),
        (["--soft-timeout", "1.5"], "--soft-timeout"),
        (["--soft-timeout", "-0.5"], "--soft-timeout"),
        (["--adaptive-wait", "-1"], "--adaptive-wait"),
        (["--adaptive-wait", "1001"], "--adaptive-wait"),
        (["--adaptive-wait", "nan"], "--adaptive-wait"),
    ],
)
def test_a_bad_flag_is_a_usage_error_naming_it(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        search_server_cli.main(argv)
    assert exited.value.code == 2
    assert named in capsys.readouterr().err
