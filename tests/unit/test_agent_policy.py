"""The agent's health policy, alone: probe results in, decisions out, a fake clock.

No ZooKeeper and no sleeping: :class:`HealthPolicy` is fed :class:`ProbeResult` values
and the tests move its clock. That the agent carries the decisions out (registers,
deregisters, counts and logs) is shown end to end by the agent's integration tests
(``tests/integration/test_data_server.py``, ``tests/scenarios/test_embedding.py``...).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from discovery.agent.policy import Action, AgentState, Decision, HealthPolicy, ProbeResult
from discovery.config import AgentConfig
from tests.support import FakeClock

OK = ProbeResult(True, "ok", 0.01)


def failed(reason: str = "HTTP 503") -> ProbeResult:
    return ProbeResult(False, "error", 0.01, reason)


def _policy(clock: FakeClock, *, ready: bool = True, **config: Any) -> HealthPolicy:
    settings_ = {
        "fall": 3,
        "rise": 2,
        "flap_max": 2,
        "flap_window": 300.0,
        "flap_cooldown": 120.0,
        **config,
    }
    policy = HealthPolicy(AgentConfig(**settings_), clock=clock)
    if ready:
        policy.set_ready()
    return policy


def _serving(clock: FakeClock, **config: Any) -> HealthPolicy:
    policy = _policy(clock, **config)
    assert policy.observe(OK).action is Action.ADMIT
    return policy


def _feed(policy: HealthPolicy, *results: ProbeResult) -> list[Action]:
    return [policy.observe(result).action for result in results]


def _outage(policy: HealthPolicy) -> Decision:
    """Fail the server out (``fall`` failures), then ``rise`` good probes: the last
    decision, a re-admission or a damping."""
    config = policy.config
    assert _feed(policy, *[failed()] * config.fall)[-1] is Action.LEAVE
    assert policy.state is AgentState.OFFLINE
    decisions = [policy.observe(OK) for _ in range(config.rise)]
    assert [d.action for d in decisions[:-1]] == [Action.STAY] * (config.rise - 1)
    return decisions[-1]


def _damped(clock: FakeClock) -> HealthPolicy:
    """A policy that has just held the server out: re-admitted twice (flap_max), then
    rise good probes once more, all at one instant."""
    policy = _serving(clock)
    assert [_outage(policy).action for _ in range(3)] == [
        Action.READMIT,
        Action.READMIT,
        Action.DAMP,
    ]
    return policy


# -- the first admission ------------------------------------------------------------


def test_the_first_admission_needs_ready_and_one_good_probe() -> None:
    policy = _policy(FakeClock(), ready=False)
    assert policy.state is AgentState.STARTING
    assert not policy.ready
    # Not ready: a probe result changes nothing, not even the counts.
    assert policy.observe(OK) == Decision(Action.STAY, AgentState.STARTING)
    assert (policy.consecutive_successes, policy.last_probe) == (0, None)

    policy.set_ready()
    assert policy.ready
    # A failure while starting is counted, but only a good probe admits.
    assert policy.observe(failed()) == Decision(Action.STAY, AgentState.STARTING)
    assert policy.consecutive_failures == 1
    assert policy.observe(OK) == Decision(Action.ADMIT, AgentState.SERVING)
    assert (policy.state, policy.reason) == (AgentState.SERVING, None)
    assert (policy.consecutive_failures, policy.consecutive_successes) == (0, 1)
    assert policy.last_probe == OK


def test_the_first_admission_is_one_good_probe_even_when_rise_is_more() -> None:
    policy = _policy(FakeClock(), rise=5)
    assert policy.observe(OK).action is Action.ADMIT


# -- fall and rise -----------------------------------------------------------------


def test_fall_consecutive_failures_take_the_server_offline() -> None:
    policy = _serving(FakeClock())
    assert _feed(policy, failed(), failed()) == [Action.STAY, Action.STAY]
    assert policy.state is AgentState.SERVING
    decision = policy.observe(failed("timed out after 1s"))
    assert decision == Decision(
        Action.LEAVE, AgentState.OFFLINE, "3 failed probes, last: timed out after 1s"
    )
    assert (policy.state, policy.reason) == (AgentState.OFFLINE, decision.reason)
    # Further failures only count.
    assert policy.observe(failed()).action is Action.STAY
    assert policy.consecutive_failures == 4


def test_a_good_probe_between_failures_starts_the_count_again() -> None:
    policy = _serving(FakeClock())
    actions = _feed(policy, failed(), failed(), OK, failed(), failed())
    assert actions == [Action.STAY] * 5
    assert policy.state is AgentState.SERVING
    assert policy.consecutive_failures == 2
    assert policy.observe(failed()).action is Action.LEAVE


def test_rise_good_probes_bring_the_server_back() -> None:
    policy = _serving(FakeClock())
    _feed(policy, failed(), failed(), failed())
    # One good probe is not health, and a failure starts the count again.
    assert _feed(policy, OK, failed(), OK) == [Action.STAY] * 3
    assert policy.state is AgentState.OFFLINE
    assert policy.observe(OK) == Decision(Action.READMIT, AgentState.SERVING)
    assert (policy.state, policy.reason) == (AgentState.SERVING, None)
    assert policy.consecutive_successes == 2


def test_rise_one_and_fall_one_act_on_every_probe() -> None:
    policy = _serving(FakeClock(), rise=1, fall=1, flap_max=10)
    assert policy.observe(failed("boom")) == Decision(
        Action.LEAVE, AgentState.OFFLINE, "1 failed probes, last: boom"
    )
    assert policy.observe(OK).action is Action.READMIT
    assert policy.observe(failed()).action is Action.LEAVE
    assert policy.observe(OK).action is Action.READMIT


# -- flapping ---------------------------------------------------------------------


def test_flapping_readmissions_within_the_window_are_damped() -> None:
    clock = FakeClock()
    policy = _serving(clock)  # the first admission is no flap
    assert _outage(policy).action is Action.READMIT
    clock.advance(100)
    assert _outage(policy).action is Action.READMIT
    clock.advance(100)
    # Re-admitted flap_max (2) times within the window: held out.
    decision = _outage(policy)
    assert decision == Decision(
        Action.DAMP,
        AgentState.DAMPED,
        "flapping: re-admitted 2 times in 300s; held out for 120s",
    )
    assert policy.damped_for() == 120.0
    # Good probes during the cool-down change nothing.
    clock.advance(119.5)
    assert _feed(policy, OK, OK, OK) == [Action.STAY] * 3
    assert policy.state is AgentState.DAMPED
    assert policy.damped_for() == 0.5
    # At the end of the cool-down (its last instant too), with rise good probes in a
    # row behind it, it comes back.
    clock.advance(0.5)
    assert policy.damped_for() == 0.0
    assert policy.observe(OK) == Decision(Action.READMIT, AgentState.SERVING)
    assert policy.damped_for() is None


def test_after_the_cool_down_the_flap_history_starts_afresh() -> None:
    clock = FakeClock()
    policy = _damped(clock)
    clock.advance(120)
    assert policy.observe(OK).action is Action.READMIT
    # The cool-down was the penalty: flap_max more re-admissions before the next one.
    assert _outage(policy).action is Action.READMIT
    assert _outage(policy).action is Action.DAMP


def test_after_the_cool_down_rise_good_probes_are_still_needed() -> None:
    clock = FakeClock()
    policy = _damped(clock)
    # Failures while damped go nowhere else.
    assert _feed(policy, *[failed()] * 5) == [Action.STAY] * 5
    assert policy.state is AgentState.DAMPED
    clock.advance(200)
    assert policy.damped_for() == 0.0
    assert policy.observe(OK) == Decision(Action.STAY, AgentState.DAMPED, policy.reason)
    assert policy.observe(OK).action is Action.READMIT


@pytest.mark.parametrize(
    ("later", "action"),
    [
        pytest.param(60.0, Action.DAMP, id="exactly-flap_window-ago-still-counts"),
        pytest.param(60.001, Action.READMIT, id="older-is-forgotten"),
    ],
)
def test_the_flap_window_boundary(later: float, action: Action) -> None:
    clock = FakeClock()
    policy = _serving(clock, flap_max=1, flap_window=60.0)
    assert _outage(policy).action is Action.READMIT
    clock.advance(later)
    assert _outage(policy).action is action


def test_flap_max_one_damps_the_second_readmission_and_zero_cooldown_ends_at_once() -> None:
    clock = FakeClock()
    policy = _serving(clock, flap_max=1, flap_cooldown=0.0)
    assert _outage(policy).action is Action.READMIT
    decision = _outage(policy)
    assert decision.action is Action.DAMP
    assert decision.reason == "flapping: re-admitted 1 times in 300s; held out for 0s"
    assert policy.damped_for() == 0.0
    # Damped with rise good probes behind it already: the next good one re-admits.
    assert policy.observe(OK).action is Action.READMIT


# -- the operator -----------------------------------------------------------------


def test_take_offline_holds_the_server_out_until_bring_online() -> None:
    policy = _serving(FakeClock())
    assert policy.take_offline("maintenance")
    assert (policy.state, policy.reason) == (AgentState.ADMIN_OFFLINE, "maintenance")
    # Probes count but change nothing.
    assert _feed(policy, OK, OK, OK) == [Action.STAY] * 3
    assert policy.consecutive_successes == 4
    assert policy.state is AgentState.ADMIN_OFFLINE
    # Taking it offline again only changes the reason.
    assert policy.take_offline("still maintenance")
    assert policy.reason == "still maintenance"

    assert policy.bring_online()
    assert (policy.state, policy.reason) == (AgentState.STARTING, None)
    assert (policy.consecutive_failures, policy.consecutive_successes) == (0, 0)
    assert policy.observe(OK) == Decision(Action.ADMIT, AgentState.SERVING)


def test_bring_online_does_nothing_unless_taken_offline() -> None:
    clock = FakeClock()
    policy = _serving(clock)
    _feed(policy, OK, failed(), failed())
    assert not policy.bring_online()
    assert policy.state is AgentState.SERVING
    assert policy.consecutive_failures == 2
    assert policy.observe(failed()).action is Action.LEAVE
    assert not policy.bring_online()
    assert policy.state is AgentState.OFFLINE


def test_take_offline_and_bring_online_before_ready_still_wait_for_ready() -> None:
    policy = _policy(FakeClock(), ready=False)
    assert policy.take_offline("admin")
    assert policy.bring_online()
    assert policy.observe(OK).action is Action.STAY
    policy.set_ready()
    assert policy.observe(OK).action is Action.ADMIT


def test_take_offline_while_damped_and_back_skips_the_flap_check_but_keeps_the_history() -> None:
    clock = FakeClock()
    policy = _damped(clock)
    assert policy.take_offline("admin")
    assert policy.damped_for() is None
    assert policy.bring_online()
    # An admission out of STARTING is not a re-admission: no flap check, no flap.
    assert policy.observe(OK).action is Action.ADMIT
    # The re-admissions before it are still in the window.
    assert _outage(policy).action is Action.DAMP


# -- draining and stopped -------------------------------------------------------------


def test_draining_ignores_probes_and_the_operator() -> None:
    policy = _serving(FakeClock())
    last = policy.last_probe
    assert policy.drain()
    assert (policy.state, policy.reason) == (AgentState.DRAINING, "draining")
    assert policy.finished
    assert _feed(policy, *[failed()] * 5) == [Action.STAY] * 5
    assert (policy.consecutive_failures, policy.consecutive_successes) == (0, 1)
    assert policy.last_probe is last
    assert not policy.take_offline("admin")
    assert not policy.bring_online()
    assert not policy.drain()
    assert (policy.state, policy.reason) == (AgentState.DRAINING, "draining")


def test_drain_from_offline_and_admin_offline() -> None:
    policy = _serving(FakeClock())
    _feed(policy, failed(), failed(), failed())
    assert policy.drain()
    assert policy.state is AgentState.DRAINING
    admin = _serving(FakeClock())
    assert admin.take_offline("admin")
    assert admin.drain()
    assert admin.state is AgentState.DRAINING


def test_stop_ends_every_state_and_ignores_probes_afterwards() -> None:
    for before in ("starting", "serving", "admin_offline", "draining"):
        policy = _policy(FakeClock())
        if before != "starting":
            policy.observe(OK)
        if before == "admin_offline":
            policy.take_offline("admin")
        if before == "draining":
            policy.drain()
        assert policy.state.value == before
        policy.stop()
        assert (policy.state, policy.reason) == (AgentState.STOPPED, None)
        assert policy.finished
        assert policy.observe(OK) == Decision(Action.STAY, AgentState.STOPPED)
        assert not policy.drain()
        assert not policy.take_offline("admin")
        assert not policy.bring_online()
        assert policy.state is AgentState.STOPPED


# -- any sequence -----------------------------------------------------------------

# The state diagram of discovery.agent.agent, as the edges a probe may take.
_EDGES = {
    (AgentState.STARTING, Action.ADMIT, AgentState.SERVING),
    (AgentState.SERVING, Action.LEAVE, AgentState.OFFLINE),
    (AgentState.OFFLINE, Action.READMIT, AgentState.SERVING),
    (AgentState.OFFLINE, Action.DAMP, AgentState.DAMPED),
    (AgentState.DAMPED, Action.READMIT, AgentState.SERVING),
}


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(st.booleans(), st.sampled_from([0.0, 1.0, 30.0, 200.0])), max_size=80),
    fall=st.integers(1, 4),
    rise=st.integers(1, 4),
    flap_max=st.integers(1, 3),
)
def test_any_probe_sequence_follows_the_diagram_and_counts_the_trailing_run(
    steps: list[tuple[bool, float]], fall: int, rise: int, flap_max: int
) -> None:
    clock = FakeClock()
    policy = _policy(clock, fall=fall, rise=rise, flap_max=flap_max)
    run_ok, run = True, 0
    for ok, wait in steps:
        clock.advance(wait)
        before = policy.state
        decision = policy.observe(OK if ok else failed())
        run = run + 1 if ok == run_ok else 1
        run_ok = ok
        assert decision.state is policy.state
        assert decision.reason == policy.reason
        if decision.action is Action.STAY:
            assert policy.state is before
        else:
            assert (before, decision.action, policy.state) in _EDGES
        # Out of STARTING on the first good probe, out of SERVING exactly on the
        # fall-th failure in a row, out of OFFLINE only after rise good probes.
        assert (decision.action is Action.ADMIT) == (before is AgentState.STARTING and ok)
        assert (decision.action is Action.LEAVE) == (
            before is AgentState.SERVING and not ok and run >= fall
        )
        if decision.action is Action.READMIT:
            assert ok
            assert run >= rise
        assert (policy.consecutive_successes, policy.consecutive_failures) == (
            (run, 0) if ok else (0, run)
        )


# -- busy, not sick: slowness the machine's CPU stall explains ---------------------------


def slow(latency: float = 0.8, stall: float | None = 0.9, kind: str = "slow") -> ProbeResult:
    """A probe that answered (``kind="slow"``) or timed out after ``latency`` seconds,
    while the machine was stalled ``stall`` of the time (None: unknown)."""
    return ProbeResult(False, kind, latency, f"{kind} after {latency:g}s", stall_share=stall)


def _busy_policy(clock: FakeClock, **config: Any) -> HealthPolicy:
    """A serving policy with max_latency 0.5 and a busy grace of 10 s (unless given)."""
    return _serving(clock, **{"max_latency": 0.5, "busy_grace": 10.0, **config})


def test_a_slow_probe_the_stall_explains_is_excused_as_neither_failure_nor_success() -> None:
    clock = FakeClock()
    policy = _busy_policy(clock, fall=3)
    for _ in range(9):  # three times fall, within the grace
        assert policy.observe(slow()) == Decision(
            Action.STAY, AgentState.SERVING, None, excused=True
        )
        clock.advance(1)
    assert policy.state is AgentState.SERVING
    assert (policy.consecutive_failures, policy.consecutive_successes) == (0, 0)
    last = policy.last_probe
    assert last is not None
    assert (last.ok, last.kind, last.latency, last.stall_share) == (False, "busy", 0.8, 0.9)
    assert last.reason == "slow after 0.8s; excused: the CPU was stalled 90% of it"
    assert policy.busy_for() == 9.0


@pytest.mark.parametrize(
    ("result", "excused"),
    [
        # latency * (1 - stall) <= max_latency (0.5), its boundary included.
        pytest.param(slow(1.0, 0.5), True, id="exactly-at-the-bound"),
        pytest.param(slow(1.0, 0.25), False, id="above-the-bound"),
        pytest.param(slow(0.625, 0.25), True, id="below-the-bound"),
        pytest.param(slow(1.0, 0.5, "timeout"), True, id="a-timeout-likewise"),
        pytest.param(slow(1.0, 0.25, "timeout"), False, id="a-timeout-above-the-bound"),
        pytest.param(slow(5.0, 1.5), True, id="stall-clamped-to-1"),
        pytest.param(slow(0.6, -0.5), False, id="stall-clamped-to-0"),
        pytest.param(slow(0.6, None), False, id="stall-unknown"),
        pytest.param(slow(0.6, float("nan")), False, id="stall-nan"),
        pytest.param(slow(0.6, 1.0, "error"), False, id="an-error-never"),
    ],
)
def test_what_the_stall_explains(result: ProbeResult, excused: bool) -> None:
    policy = _busy_policy(FakeClock())
    decision = policy.observe(result)
    assert decision.excused is excused
    assert policy.consecutive_failures == (0 if excused else 1)
    assert policy.last_probe is not None
    assert policy.last_probe.kind == ("busy" if excused else result.kind)


def test_errors_are_never_excused_however_stalled_the_machine() -> None:
    policy = _busy_policy(FakeClock(), fall=3)
    error = ProbeResult(False, "error", 0.01, "HTTP 503", stall_share=1.0)
    assert _feed(policy, error, error) == [Action.STAY, Action.STAY]
    decision = policy.observe(error)
    assert decision == Decision(
        Action.LEAVE, AgentState.OFFLINE, "3 failed probes, last: HTTP 503", excused=False
    )
    assert policy.busy_for() is None


@pytest.mark.parametrize(
    ("later", "excused"),
    [
        pytest.param(10.0, True, id="exactly-busy_grace-after-the-first-is-excused"),
        pytest.param(10.001, False, id="later-counts"),
    ],
)
def test_the_busy_grace_boundary(later: float, excused: bool) -> None:
    clock = FakeClock()
    policy = _busy_policy(clock)
    assert policy.observe(slow()).excused
    clock.advance(later)
    assert policy.observe(slow()).excused is excused
    assert policy.busy_for() == pytest.approx(later)


def test_after_the_grace_slow_probes_count_and_take_the_server_offline() -> None:
    clock = FakeClock()
    policy = _busy_policy(clock, fall=3)
    assert policy.observe(slow()).excused
    clock.advance(10.5)
    assert _feed(policy, slow(), slow()) == [Action.STAY, Action.STAY]
    assert policy.consecutive_failures == 2
    decision = policy.observe(slow(kind="timeout"))
    assert decision.action is Action.LEAVE
    assert not decision.excused
    # The reason says why a stalled machine's slowness counted after all.
    assert decision.reason == (
        "3 failed probes, last: timeout after 0.8s (not excused: CPU-stall grace of 10s used up)"
    )
    assert policy.state is AgentState.OFFLINE


def test_the_grace_runs_from_the_first_excuse_through_errors_until_a_good_probe() -> None:
    clock = FakeClock()
    policy = _busy_policy(clock, fall=10)
    # Failures before the first excuse do not start the grace.
    assert _feed(policy, failed(), slow(stall=0.1)) == [Action.STAY] * 2
    assert policy.busy_for() is None
    clock.advance(5)
    assert policy.observe(slow()).excused  # the grace starts here
    clock.advance(4)
    assert not policy.observe(failed()).excused  # an error does not end the run...
    clock.advance(7)
    assert not policy.observe(slow()).excused  # ...so 11 s after the first, used up
    assert policy.busy_for() == 11.0
    assert policy.consecutive_failures == 4
    # A good probe ends the run: the next slow one opens a grace of its own.
    assert policy.observe(OK).action is Action.STAY
    assert policy.busy_for() is None
    clock.advance(1)
    assert policy.observe(slow()).excused
    assert policy.busy_for() == 0.0


def test_busy_grace_zero_excuses_nothing() -> None:
    policy = _busy_policy(FakeClock(), busy_grace=0.0, fall=2)
    decisions = [policy.observe(slow(stall=1.0)) for _ in range(2)]
    assert [d.excused for d in decisions] == [False, False]
    assert decisions[-1].action is Action.LEAVE
    assert policy.busy_for() is None


def test_an_excuse_keeps_the_failures_and_breaks_a_run_of_good_probes() -> None:
    clock = FakeClock()
    policy = _busy_policy(clock, fall=3, rise=2)
    # Failures stand across an excuse: an erroring server still reaches fall.
    assert _feed(policy, failed(), failed(), slow()) == [Action.STAY] * 3
    assert policy.consecutive_failures == 2
    assert policy.observe(failed()).action is Action.LEAVE
    # rise asks for good probes in a row: an excused slow one between them breaks it.
    assert _feed(policy, OK, slow(), OK) == [Action.STAY] * 3
    assert policy.consecutive_successes == 1
    assert policy.state is AgentState.OFFLINE
    assert policy.observe(OK).action is Action.READMIT


def test_an_excusable_probe_before_ready_or_after_drain_changes_nothing() -> None:
    policy = _policy(FakeClock(), ready=False, max_latency=0.5, busy_grace=10.0)
    assert policy.observe(slow()) == Decision(Action.STAY, AgentState.STARTING)
    assert (policy.last_probe, policy.busy_for()) == (None, None)
    policy.set_ready()
    policy.observe(OK)
    policy.drain()
    assert not policy.observe(slow()).excused
    assert policy.busy_for() is None


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["ok", "error", "stalled", "unstalled"]),
            st.sampled_from([0.0, 0.5, 1.0, 3.0, 10.0]),
        ),
        max_size=80,
    ),
    grace=st.sampled_from([0.0, 1.0, 5.0, 30.0]),
    fall=st.integers(1, 4),
)
def test_excuses_stay_within_the_grace_of_the_first_in_a_run(
    steps: list[tuple[str, float]], grace: float, fall: int
) -> None:
    clock = FakeClock()
    policy = _policy(clock, fall=fall, max_latency=0.5, busy_grace=grace)
    results = {
        "ok": OK,
        "error": ProbeResult(False, "error", 0.01, "HTTP 503", stall_share=1.0),
        "stalled": slow(0.8, 0.9),
        "unstalled": slow(0.8, 0.0),
    }
    first_excuse: float | None = None
    counted = 0  # failures counted since the last good probe
    for name, wait in steps:
        clock.advance(wait)
        decision = policy.observe(results[name])
        if name == "ok":
            first_excuse, counted = None, 0
        if decision.excused:
            # Only slowness the stall explains, only within the grace of the run's first.
            assert name == "stalled"
            first_excuse = clock.now if first_excuse is None else first_excuse
            assert clock.now - first_excuse <= grace
            assert decision.action is Action.STAY
        elif name != "ok":
            counted += 1
        assert policy.consecutive_failures == counted


@pytest.mark.parametrize(
    ("busy", "kind", "excused"),
    [
        (0.95, "timeout", True),  # serving without a pause: load
        (0.95, "slow", True),
        (0.9, "slow", True),  # the bound itself
        (0.85, "timeout", False),  # idle a sixth of the time: stuck somewhere, not busy
        (None, "timeout", False),  # unknown (a machine-wide source)
        (1.0, "error", False),  # a wrong answer is never load's
    ],
)
def test_a_probe_slow_while_the_servers_thread_was_busy_all_along_is_excused(
    busy: float | None, kind: str, excused: bool
) -> None:
    """A loop saturated by the searches it serves answers its probe late, yet it is
    serving, not stuck: load, which must not take it offline. Its thread was running or
    waiting for a CPU nearly all of the probe (a stuck one is blocked in between)."""
    clock = FakeClock()
    policy = _busy_policy(clock, fall=1)
    result = dataclasses.replace(slow(latency=1.0, stall=0.0, kind=kind), busy_share=busy)
    if kind == "error":
        result = dataclasses.replace(result, ok=False)
    decision = policy.observe(result)
    assert decision.excused is excused
    assert (policy.state is AgentState.SERVING) is excused
