"""Busy, not sick: the agent does not take its server offline because the machine is
short of CPU (issue 40, item 3).

Four parts: the sources, :class:`ThreadRunDelay` (the default: one thread's run delay)
and :class:`PsiCpuPressure` (the machine's stall), reading files written here (good,
missing, malformed) and this machine's; the ``--probe-busy-grace`` option; agents
against the real ZooKeeper of the fixtures with a fake pressure source, whose "stall"
is a share of the real monotonic clock, so that a probe's stall share is what the test
says whatever the machine's own load; and agents with the default source, a hung
probe not excused while other processes keep a CPU busy. The rule itself, boundaries
included, is unit-tested with a fake clock in ``tests/unit/test_agent_policy.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from data_server.faults import Fault
from discovery import (
    Agent,
    AgentState,
    CallableProbe,
    CpuPressure,
    PsiCpuPressure,
    ThreadRunDelay,
    ZkConfig,
)
from discovery.agent.pressure import PSI_CPU_PATH, SCHEDSTAT_PATH, PressureReading, stall_share
from discovery.cli.options import AGENT_OPTIONS, add_options, agent_config
from discovery.config import AgentConfig
from discovery.errors import ConfigError
from discovery.zk.paths import DATA_SERVERS_PATH
from tests.support import (
    FAST_AGENT,
    DataServerFactory,
    FakeClock,
    SessionFactory,
    absent,
    eventually,
    make_instance,
    sample,
)

PSI = (
    "some avg10=1.50 avg60=0.80 avg300=0.20 total={some}\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=12\n"
)


# -- PsiCpuPressure -----------------------------------------------------------------


def test_psi_reading_is_the_some_total_in_seconds_at_the_clock(tmp_path: Path) -> None:
    path = tmp_path / "cpu"
    path.write_text(PSI.format(some=2_500_000))
    clock = FakeClock()
    pressure = PsiCpuPressure(path, clock=clock)
    assert isinstance(pressure, CpuPressure)
    assert pressure.read() == PressureReading(stalled=2.5, at=1000.0)
    # Read afresh every time: the counter and the clock move on.
    path.write_text(PSI.format(some=3_000_000))
    clock.advance(2)
    assert pressure.read() == PressureReading(stalled=3.0, at=1002.0)


def test_psi_without_a_full_line_as_on_older_kernels(tmp_path: Path) -> None:
    path = tmp_path / "cpu"
    path.write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n")
    reading = PsiCpuPressure(path).read()
    assert reading is not None
    assert reading.stalled == 7e-6


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("", id="empty"),
        pytest.param("full avg10=0.00 avg60=0.00 avg300=0.00 total=12\n", id="no-some-line"),
        pytest.param("some avg10=0.00 avg60=0.00 avg300=0.00\n", id="no-total"),
        pytest.param("some avg10=0.00 total=12abc\n", id="total-not-a-number"),
        pytest.param("some avg10=0.00 total=-5\n", id="total-negative"),
        pytest.param("some avg10=0.00 total=\n", id="total-empty"),
        pytest.param("\x00\xff garbage", id="binary"),
    ],
)
def test_psi_malformed_is_unknown(tmp_path: Path, content: str) -> None:
    path = tmp_path / "cpu"
    path.write_text(content, encoding="latin-1")
    assert PsiCpuPressure(path).read() is None


def test_psi_missing_or_unreadable_is_unknown_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="discovery.agent.pressure")
    missing = PsiCpuPressure(tmp_path / "absent")
    assert [missing.read() for _ in range(3)] == [None, None, None]
    assert len(caplog.records) == 1
    assert "FileNotFoundError" in caplog.records[0].getMessage()
    assert PsiCpuPressure(tmp_path).read() is None  # a directory: IsADirectoryError
    # Once the file is there, it is read (and the change logged).
    (tmp_path / "absent").write_text(PSI.format(some=1))
    assert missing.read() is not None
    assert "readable again" in caplog.records[-1].getMessage()


@pytest.mark.skipif(not os.path.exists(PSI_CPU_PATH), reason="no PSI on this kernel")
def test_psi_of_this_machine_is_a_counter() -> None:
    pressure = PsiCpuPressure()
    first, second = pressure.read(), pressure.read()
    assert first is not None
    assert second is not None
    assert second.stalled >= first.stalled >= 0
    assert second.at >= first.at


# -- ThreadRunDelay -------------------------------------------------------------------

# Whether this machine has per-thread scheduler statistics (Linux, CONFIG_SCHED_INFO).
HAS_SCHEDSTAT = os.path.exists(SCHEDSTAT_PATH.format(tid=threading.get_native_id()))
needs_schedstat = pytest.mark.skipif(not HAS_SCHEDSTAT, reason="no /proc/self/task/*/schedstat")


def test_run_delay_is_the_second_schedstat_counter_in_seconds_at_the_clock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "schedstat"
    path.write_text("1234567890 2500000000 42\n")
    clock = FakeClock()
    pressure = ThreadRunDelay(path=path, clock=clock)
    assert isinstance(pressure, CpuPressure)
    assert pressure.read() == PressureReading(stalled=2.5, at=1000.0, busy=3.73456789)
    # Read afresh every time: the counter and the clock move on.
    path.write_text("1234567890 3000000000 43\n")
    clock.advance(2)
    assert pressure.read() == PressureReading(stalled=3.0, at=1002.0, busy=4.23456789)


def test_run_delay_of_a_thread_by_its_id() -> None:
    assert ThreadRunDelay().tid == threading.get_native_id()
    pressure = ThreadRunDelay(4321)
    assert pressure.tid == 4321
    assert pressure.path == "/proc/self/task/4321/schedstat"
    assert "tid=4321" in repr(pressure)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("", id="empty"),
        pytest.param("1234 5678\n", id="two-fields"),
        pytest.param("1234 5678 9 10\n", id="four-fields"),
        pytest.param("1234 56x8 9\n", id="not-a-number"),
        pytest.param("1234 -5678 9\n", id="negative"),
        pytest.param("some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n", id="a-psi-file"),
        pytest.param("\x00\xff garbage", id="binary"),
    ],
)
def test_run_delay_malformed_is_unknown(tmp_path: Path, content: str) -> None:
    path = tmp_path / "schedstat"
    path.write_text(content, encoding="latin-1")
    assert ThreadRunDelay(path=path).read() is None


def test_run_delay_missing_is_unknown_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="discovery.agent.pressure")
    missing = ThreadRunDelay(path=tmp_path / "absent")
    assert [missing.read() for _ in range(3)] == [None, None, None]
    assert len(caplog.records) == 1
    assert "FileNotFoundError" in caplog.records[0].getMessage()
    (tmp_path / "absent").write_text("1 2 3\n")
    reading = missing.read()
    assert reading is not None
    assert reading.stalled == 2e-9
    assert "readable again" in caplog.records[-1].getMessage()


def test_run_delay_of_a_thread_that_is_gone_is_unknown() -> None:
    tids: list[int] = []
    thread = threading.Thread(target=lambda: tids.append(threading.get_native_id()))
    thread.start()
    thread.join()
    # join() returns when Python is done with the thread; the kernel's task may linger
    # a moment longer.
    pressure = ThreadRunDelay(tids[0])
    deadline = time.monotonic() + 5
    while pressure.read() is not None:
        assert time.monotonic() < deadline, "the thread's schedstat is still there"
        time.sleep(0.001)  # ok-sleep: interval of a deadline-bounded poll


@needs_schedstat
def test_run_delay_of_this_thread_is_a_counter() -> None:
    pressure = ThreadRunDelay()
    readings = [pressure.read() for _ in range(100)]
    assert all(reading is not None for reading in readings)
    known = [reading for reading in readings if reading is not None]
    for first, second in itertools.pairwise(known):
        assert second.stalled >= first.stalled >= 0
        assert second.at >= first.at
    # Read from another thread (as the agent's loop reads the server's): the same file.
    other: list[PressureReading | None] = []
    thread = threading.Thread(target=lambda: other.append(pressure.read()))
    thread.start()
    thread.join()
    assert other[0] is not None
    assert other[0].stalled >= known[-1].stalled


def _spinning_on(cpu: int) -> subprocess.Popen[bytes]:
    """A process that keeps ``cpu`` busy until killed."""
    code = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code, str(cpu)])


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as file:
            return int(file.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


@pytest.fixture
def busy_cpu() -> Iterator[int]:
    """One CPU of this machine kept busy by two other processes (so that a task of
    ours running there waits for it about two thirds of the time): the CPU's number.
    The other CPUs are left alone."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    cpu = min(os.sched_getaffinity(0))
    hogs = [_spinning_on(cpu) for _ in range(2)]
    try:
        deadline = time.monotonic() + 15
        while not all(_cpu_seconds(hog.pid) > 0.05 for hog in hogs):
            assert time.monotonic() < deadline, "the CPU hogs did not start spinning"
            time.sleep(0.01)  # ok-sleep: interval of a deadline-bounded poll
        yield cpu
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@needs_schedstat
def test_a_thread_starved_of_cpu_by_other_processes_has_run_delay(busy_cpu: int) -> None:
    pressure = ThreadRunDelay()
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {busy_cpu})  # this thread only
    try:
        before = pressure.read()
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:  # runnable all along, sharing with the hogs
            pass
        after = pressure.read()
    finally:
        os.sched_setaffinity(0, allowed)
    share = stall_share(before, after)
    assert share is not None
    assert share > 0.25  # about 2/3: three spinners on one CPU


@needs_schedstat
def test_a_sleeping_thread_has_no_run_delay_on_a_busy_cpu(busy_cpu: int) -> None:
    pressure = ThreadRunDelay()
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {busy_cpu})
    try:
        before = pressure.read()
        threading.Event().wait(0.5)  # blocked, as a hung server's loop is
        after = pressure.read()
    finally:
        os.sched_setaffinity(0, allowed)
    share = stall_share(before, after)
    assert share is not None
    assert share < 0.1  # only the wake-up's wait for the CPU


@pytest.mark.parametrize(
    ("before", "after", "share"),
    [
        pytest.param((10.0, 100.0), (10.5, 101.0), 0.5, id="half"),
        pytest.param((10.0, 100.0), (10.0, 101.0), 0.0, id="none"),
        pytest.param((10.0, 100.0), (11.2, 101.0), 1.0, id="clamped-above"),
        pytest.param((10.0, 100.0), (9.0, 101.0), 0.0, id="clamped-below"),
        pytest.param((10.0, 100.0), (10.5, 100.0), None, id="no-time"),
        pytest.param(None, (10.5, 101.0), None, id="unknown-before"),
        pytest.param((10.0, 100.0), None, None, id="unknown-after"),
    ],
)
def test_stall_share(
    before: tuple[float, float] | None, after: tuple[float, float] | None, share: float | None
) -> None:
    def reading(pair: tuple[float, float] | None) -> PressureReading | None:
        return None if pair is None else PressureReading(*pair)

    assert stall_share(reading(before), reading(after)) == share


# -- the setting ---------------------------------------------------------------------


def _parsed(argv: list[str], environ: dict[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_options(parser, AGENT_OPTIONS, environ)
    return parser.parse_args(argv)


def test_busy_grace_flag_variable_default_and_help() -> None:
    assert agent_config(_parsed([], {})).busy_grace == 120.0
    assert agent_config(_parsed([], {"DISCOVERY_PROBE_BUSY_GRACE": "30"})).busy_grace == 30.0
    flag = ["--probe-busy-grace", "0"]
    assert agent_config(_parsed(flag, {"DISCOVERY_PROBE_BUSY_GRACE": "30"})).busy_grace == 0.0
    parser = argparse.ArgumentParser()
    add_options(parser, AGENT_OPTIONS, {})
    help_text = " ".join(parser.format_help().split())
    assert "--probe-busy-grace SECONDS" in help_text
    assert "[env DISCOVERY_PROBE_BUSY_GRACE; default 120.0]" in help_text


@pytest.mark.parametrize("bad", ["-1", "inf", "nan", "soon"])
def test_busy_grace_bad_values_are_refused(bad: str) -> None:
    with pytest.raises(argparse.ArgumentError):
        _parsed(["--probe-busy-grace", bad], {})
    with pytest.raises(SystemExit):  # the parser's error, naming the variable
        _parsed([], {"DISCOVERY_PROBE_BUSY_GRACE": bad})


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_agent_config_refuses_a_bad_busy_grace(bad: float) -> None:
    with pytest.raises(ConfigError, match="--probe-busy-grace / DISCOVERY_PROBE_BUSY_GRACE"):
        AgentConfig(busy_grace=bad)


# -- the agent, against the real ZooKeeper -------------------------------------------


class FakePressure:
    """The machine stalled ``share`` of the real time from now on (None: unknown;
    ``broken``: reading raises)."""

    def __init__(self, share: float | None) -> None:
        self.share = share
        self.broken = False
        # The stall counter is integrated piecewise, so changing the share changes
        # only the stall from then on.
        self._stalled = 0.0
        self._at = time.monotonic()

    def read(self) -> PressureReading | None:
        if self.broken:
            raise OSError("pressure source broken")
        now = time.monotonic()
        if self.share is not None:
            self._stalled += self.share * (now - self._at)
        self._at = now
        return None if self.share is None else PressureReading(self._stalled, now)

    def set(self, share: float | None) -> None:
        self.read()
        self.share = share

    def __repr__(self) -> str:
        return f"FakePressure({self.share})"


class SlowSwitch:
    """A probe function: answers at once, or after ``delay`` seconds once set (never,
    for an infinite delay: a hang)."""

    def __init__(self) -> None:
        self.delay = 0.0

    async def answer(self) -> None:
        if self.delay == float("inf"):
            await asyncio.Event().wait()
        elif self.delay:
            await asyncio.sleep(self.delay)  # ok-sleep: the scripted answer's delay


# Slower than FAST_AGENT's max_latency (0.25 s), within its timeout (0.5 s); a loaded
# machine may stretch it into a timeout, which the same rule excuses.
SLOW = 0.35

AgentFactory = Callable[..., Agent]


@pytest.fixture
async def make_agent(zk_hosts: str) -> AsyncIterator[AgentFactory]:
    agents: list[Agent] = []

    def make(
        instance_id: str, probe: SlowSwitch, pressure: CpuPressure | None, **config: float
    ) -> Agent:
        agent = Agent(
            make_instance(instance_id),
            CallableProbe(probe.answer),
            zk=ZkConfig(hosts=zk_hosts, session_timeout=4),
            config=dataclasses.replace(FAST_AGENT, **config),
            pressure=pressure,
        )
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        await agent.astop()


def _probes(agent: Agent, result: str) -> float:
    return sample(agent.registry, "discovery_agent_probes_total", result=result)


async def _serving(agent: Agent, observer_exists: Callable[[], object]) -> None:
    await agent.astart()
    agent.set_ready()
    await eventually(observer_exists, message="registered")
    # The agent's status is a snapshot taken once the registration is done: the node can
    # be seen a moment before it (on a loaded machine, long enough to read the old one).
    await eventually(
        lambda: agent.status().state is AgentState.SERVING, message="status shows serving"
    )


async def test_a_stalled_machine_keeps_a_slow_server_registered_and_an_idle_one_does_not(
    make_agent: AgentFactory, make_session: SessionFactory
) -> None:
    observer = await make_session()
    path = f"{DATA_SERVERS_PATH}/ds-busy"
    probe, pressure = SlowSwitch(), FakePressure(0.9)
    agent = make_agent("ds-busy", probe, pressure)
    await _serving(agent, lambda: observer.exists(path))
    status = agent.status().to_dict()
    assert status["busy_guard"] is True
    assert status["busy_for_s"] is None
    assert sample(agent.registry, "discovery_agent_busy_guard") == 1

    # Every probe is slow while the machine is stalled 90 % of the time: at most
    # 0.5 s * 10 % of it is the server's own, inside the bound, so each is excused.
    probe.delay = SLOW
    busy_probes = 4 * FAST_AGENT.fall
    await eventually(
        lambda: _probes(agent, "busy") >= busy_probes,
        timeout=30,
        message=f"{busy_probes} probes excused as busy",
    )
    assert await observer.exists(path) is not None
    status = agent.status().to_dict()
    assert status["state"] == "serving"
    assert status["consecutive_failures"] == 0
    assert status["last_probe"]["kind"] == "busy"
    assert status["last_probe"]["stall_share"] == pytest.approx(0.9, abs=0.01)
    assert status["busy_for_s"] > 0
    assert _probes(agent, "slow") == _probes(agent, "timeout") == 0
    assert sample(agent.registry, "discovery_agent_forced_offline_total", reason="slow") == 0

    # The machine is idle again but the server still slow: its own fault, offline.
    pressure.set(0.0)
    await eventually(
        lambda: agent.status().state is AgentState.OFFLINE, timeout=30, message="offline"
    )
    assert await absent(observer, path)
    forced = sum(
        sample(agent.registry, "discovery_agent_forced_offline_total", reason=kind)
        for kind in ("slow", "timeout")
    )
    assert forced == 1


async def test_the_busy_grace_bounds_the_excuse(
    make_agent: AgentFactory, make_session: SessionFactory
) -> None:
    observer = await make_session()
    path = f"{DATA_SERVERS_PATH}/ds-starved"
    probe = SlowSwitch()
    agent = make_agent("ds-starved", probe, FakePressure(0.9), busy_grace=1.0)
    await _serving(agent, lambda: observer.exists(path))

    # Starved for good: excused for a second, then slow probes count again.
    probe.delay = SLOW
    await eventually(
        lambda: agent.status().state is AgentState.OFFLINE, timeout=30, message="offline"
    )
    assert await absent(observer, path)
    assert _probes(agent, "busy") >= 1
    status = agent.status()
    assert status.reason is not None
    assert "not excused: CPU-stall grace of 1s used up" in status.reason
    assert status.busy_for is not None
    assert status.busy_for > 1.0

    # Back to health: a good probe ends the run, and the server comes back.
    probe.delay = 0.0
    await eventually(lambda: observer.exists(path), timeout=30, message="re-registered")
    await eventually(lambda: agent.status().busy_for is None, message="the busy run ended")


@pytest.mark.parametrize("broken", [False, True], ids=["unknown", "raising"])
async def test_without_cpu_pressure_the_guard_is_off_and_nothing_is_excused(
    make_agent: AgentFactory,
    make_session: SessionFactory,
    caplog: pytest.LogCaptureFixture,
    broken: bool,
) -> None:
    caplog.set_level(logging.INFO, logger="discovery.agent")
    observer = await make_session()
    path = f"{DATA_SERVERS_PATH}/ds-nopsi"
    probe, pressure = SlowSwitch(), FakePressure(None)
    pressure.broken = broken
    agent = make_agent("ds-nopsi", probe, pressure)
    await _serving(agent, lambda: observer.exists(path))
    status = agent.status().to_dict()
    assert status["busy_guard"] is False
    assert status["last_probe"]["stall_share"] is None
    assert sample(agent.registry, "discovery_agent_busy_guard") == 0

    probe.delay = SLOW
    await eventually(
        lambda: agent.status().state is AgentState.OFFLINE, timeout=30, message="offline"
    )
    assert _probes(agent, "busy") == 0
    # Said once, at start-up, not at every probe.
    guard_off = [r for r in caplog.records if "busy guard off for ds-nopsi" in r.getMessage()]
    assert len(guard_off) == 1
    assert guard_off[0].levelno == logging.INFO


async def test_excused_probes_are_logged_at_most_every_30_seconds(
    make_agent: AgentFactory, make_session: SessionFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="discovery.agent")
    observer = await make_session()
    path = f"{DATA_SERVERS_PATH}/ds-quiet"
    probe = SlowSwitch()
    agent = make_agent("ds-quiet", probe, FakePressure(0.9))
    await _serving(agent, lambda: observer.exists(path))
    probe.delay = SLOW
    await eventually(lambda: _probes(agent, "busy") >= 3, timeout=30, message="3 busy probes")
    excused = [r for r in caplog.records if "excused as busy" in r.getMessage()]
    # Three excused probes take about a second: one warning, with the figures.
    assert len(excused) == 1
    message = excused[0].getMessage()
    assert message.startswith("ds-quiet: probe ")
    assert "(bound 250 ms)" in message
    assert "stalled 90% of the time" in message


# -- the default source: the server's own thread ----------------------------------------


async def _native_id() -> int:
    return threading.get_native_id()


def _thread_run_delay(agent: Agent) -> ThreadRunDelay:
    pressure = agent.pressure
    assert isinstance(pressure, ThreadRunDelay)
    return pressure


async def test_the_default_source_is_the_run_delay_of_the_constructing_thread(
    make_agent: AgentFactory, make_session: SessionFactory
) -> None:
    observer = await make_session()
    agent = make_agent("ds-tid", SlowSwitch(), None)
    await _serving(agent, lambda: observer.exists(f"{DATA_SERVERS_PATH}/ds-tid"))
    # This test's thread (the embedder's event loop), not the agent's loop thread.
    assert _thread_run_delay(agent).tid == threading.get_native_id()
    assert await agent.call(_native_id()) != threading.get_native_id()
    # And from a thread of its own, that one's.
    built: list[tuple[Agent, int]] = []

    def build() -> None:
        other = Agent(
            make_instance("ds-other"),
            CallableProbe(SlowSwitch().answer),
            zk=ZkConfig("127.0.0.1:1"),
        )
        built.append((other, threading.get_native_id()))

    thread = threading.Thread(target=build)
    thread.start()
    thread.join()
    other, tid = built[0]
    assert _thread_run_delay(other).tid == tid != threading.get_native_id()


async def test_with_the_default_source_a_hung_probe_is_not_excused_on_a_busy_machine(
    make_agent: AgentFactory, make_session: SessionFactory, busy_cpu: int
) -> None:
    observer = await make_session()
    path = f"{DATA_SERVERS_PATH}/ds-hung"
    probe = SlowSwitch()
    agent = make_agent("ds-hung", probe, None)  # the default source
    await _serving(agent, lambda: observer.exists(path))
    assert agent.status().busy_guard is HAS_SCHEDSTAT

    # Hung past probe_timeout while another CPU of the machine is overloaded (where PSI
    # would report a stall): the server's thread waits for nothing, so no excuse.
    probe.delay = float("inf")
    await eventually(
        lambda: agent.status().state is AgentState.OFFLINE, timeout=30, message="offline"
    )
    assert await absent(observer, path)
    assert _probes(agent, "timeout") >= FAST_AGENT.fall
    # Offline for the hang, however many probes a loaded test machine excused on the way
    # (the thread may really wait for a CPU during one; busy_grace bounds that).
    assert sample(agent.registry, "discovery_agent_forced_offline_total", reason="timeout") == 1
    last = agent.status().last_probe
    assert last is not None
    assert last.kind == "timeout"
    if HAS_SCHEDSTAT:
        assert last.stall_share is not None  # measured by the default source
    probe.delay = 0.0


@pytest.mark.parametrize(
    "fault",
    [Fault("hang"), Fault("slow", delay_ms=int(SLOW * 1000))],
    ids=["hang", "slow"],
)
async def test_a_faulty_data_server_on_a_busy_machine_is_not_excused(
    make_data_server: DataServerFactory,
    make_session: SessionFactory,
    busy_cpu: int,
    fault: Fault,
) -> None:
    server = await make_data_server()
    agent = server.agent
    assert agent is not None
    # The data server constructs its agent on its event loop: this test's thread.
    assert _thread_run_delay(agent).tid == threading.get_native_id()
    observer = await make_session()
    path = f"{DATA_SERVERS_PATH}/{server.instance_id}"
    assert await observer.exists(path) is not None

    server.faults.set(fault)
    await eventually(
        lambda: agent.status().state is AgentState.OFFLINE, timeout=30, message="offline"
    )
    assert await absent(observer, path)
    # Taken offline for the fault. Whether a probe here or there was excused is not
    # asserted: on a loaded test machine the server's thread may really wait for a CPU
    # during one, and an excuse then is right; busy_grace bounds what excuses postpone.
    forced = sum(
        sample(agent.registry, "discovery_agent_forced_offline_total", reason=reason) or 0
        for reason in ("slow", "timeout")
    )
    assert forced == 1
    server.faults.set(Fault())


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="needs /proc/<pid>/task/<tid>/schedstat")
async def test_a_data_server_whose_loop_is_saturated_by_its_work_stays_registered(
    make_data_server: DataServerFactory, make_session: SessionFactory
) -> None:
    """Load alone never takes a data server offline: a loop so busy that its own probe
    times out is serving, not stuck (its thread runs all along), so the probe is
    excused. The contrast, a loop blocked as long (idle thread), is
    ``test_a_faulty_data_server_on_a_busy_machine_is_not_excused`` and the blocked-loop
    test of test_data_server_process.py."""
    server = await make_data_server()
    agent = server.agent
    assert agent is not None
    observer = await make_session()
    path = f"{DATA_SERVERS_PATH}/{server.instance_id}"
    stop = asyncio.Event()

    async def saturate() -> None:
        # Work in 0.3 s stretches with a loop turn between them: every turn of this
        # loop (the data server's, this test's) waits for one, and a probe needs a few.
        while not stop.is_set():
            end = time.perf_counter() + 0.3
            while time.perf_counter() < end:
                pass
            await asyncio.sleep(0)  # ok-sleep: yields the loop between busy slices

    worker = asyncio.create_task(saturate())
    try:
        await eventually(
            lambda: _probes(agent, "busy") >= 2 * FAST_AGENT.fall,
            timeout=60,
            message="probes excused as busy",
        )
        assert agent.status().state is AgentState.SERVING
    finally:
        stop.set()
        await worker
    assert await observer.exists(path) is not None
    last = agent.status().last_probe
    assert last is not None
    assert sample(agent.registry, "discovery_agent_forced_offline_total", reason="timeout") == 0
