"""CPU pressure: how much of a probe's time the server was kept waiting for a CPU.

:class:`ThreadRunDelay` (the default: a thread's run delay, so a blocked server is never
excused) or :class:`PsiCpuPressure` (the machine's stall). A reading never raises; None
means unknown (logged at debug once per change), and the agent then excuses nothing.

Design: docs/design/overload.md, "Busy is not sick".
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "PSI_CPU_PATH",
    "SCHEDSTAT_PATH",
    "CpuPressure",
    "PressureReading",
    "PsiCpuPressure",
    "ThreadRunDelay",
    "busy_share",
    "stall_share",
]

log = logging.getLogger(__name__)

#: The machine's CPU pressure stall information (Linux PSI).
PSI_CPU_PATH = "/proc/pressure/cpu"

#: One thread's scheduler statistics (Linux), ``{tid}`` its native thread id.
SCHEDSTAT_PATH = "/proc/self/task/{tid}/schedstat"

# Either file is at most two lines of about 60 bytes; anything longer is not what we
# expect.
_MAX_READ = 4096


@dataclass(frozen=True)
class PressureReading:
    """One reading of a :class:`CpuPressure`.

    Attributes:
        stalled: cumulative seconds spent waiting for a CPU (by the measured thread,
            or by any task of the machine for PSI): a counter, only differences
            between two readings mean anything.
        at: monotonic seconds when it was read, on the source's own clock, so that
            the share of two readings does not depend on the agent's clock.
        busy: cumulative seconds the measured thread was running or waiting for a CPU
            (not blocked, not sleeping), where the source knows it (a thread's, not
            the machine's: None for PSI).
    """

    stalled: float
    at: float
    busy: float | None = None


@runtime_checkable
class CpuPressure(Protocol):
    """Where the agent learns how long the server was kept waiting for a CPU.

    :meth:`read` is called on the agent's loop twice per probe, so it must be cheap
    and must not block; None means "unknown" (then no probe is excused). It should
    not raise; if it does, the agent treats the reading as unknown.
    """

    def read(self) -> PressureReading | None: ...


class _CounterFile:
    """A cumulative counter in a small kernel-generated file, read afresh each time;
    what is wrong with it is logged once per change."""

    # What the file should hold, for the log.
    _expected = "a counter"

    def __init__(self, path: str, clock: Callable[[], float]) -> None:
        self.path = path
        self._clock = clock
        # Why the last read gave nothing (None after a good one): a problem is logged
        # when it first appears, not on every probe.
        self._problem: str | None = None

    def read(self) -> PressureReading | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = os.read(fd, _MAX_READ)
            finally:
                os.close(fd)
        except OSError as exc:
            self._note_unknown(f"{type(exc).__name__}: {exc.strerror or exc}")
            return None
        at = self._clock()
        parsed = self._parse(data)
        if parsed is None:
            self._note_unknown(f"expected {self._expected}, got {data[:120]!r}")
            return None
        if self._problem is not None:
            log.debug("CPU pressure readable again from %s", self.path)
            self._problem = None
        stalled, busy = parsed
        return PressureReading(stalled, at, busy)

    def _parse(self, data: bytes) -> tuple[float, float | None] | None:
        """The stalled and busy counters in seconds; None if ``data`` is not what the
        file should hold."""
        raise NotImplementedError

    def _note_unknown(self, problem: str) -> None:
        if problem != self._problem:
            log.debug("CPU pressure unknown (%s): %s", self.path, problem)
            self._problem = problem


class ThreadRunDelay(_CounterFile):
    """:class:`CpuPressure` of one thread: its ``run_delay`` in Linux's
    ``/proc/self/task/<tid>/schedstat``, the time it was runnable but given no CPU.
    The default of the agent (see the module docstring).

    Args:
        tid: the thread's native id (``threading.get_native_id()``); by default the
            thread calling the constructor. Only this process's threads are found.
        path: the schedstat file, instead of the one of ``tid`` (for tests).
        clock: monotonic seconds, the readings' ``at``.
    """

    def __init__(
        self,
        tid: int | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tid = threading.get_native_id() if tid is None else tid
        super().__init__(
            SCHEDSTAT_PATH.format(tid=self.tid) if path is None else os.fspath(path), clock
        )

    _expected = "three counters '<ns on a CPU> <ns waiting> <timeslices>'"

    def _parse(self, data: bytes) -> tuple[float, float | None] | None:
        # "<ns on a CPU> <ns waiting on a runqueue> <timeslices>\n"
        fields = data.split()
        if len(fields) != 3 or not all(field.isdigit() for field in fields):
            return None
        waiting = int(fields[1]) / 1e9
        return waiting, int(fields[0]) / 1e9 + waiting

    def __repr__(self) -> str:
        return f"ThreadRunDelay(tid={self.tid}, path={self.path!r})"


class PsiCpuPressure(_CounterFile):
    """:class:`CpuPressure` from a Linux PSI file (the ``some`` line's ``total``):
    the machine's (or a cgroup's) stall, not the server's; see the module docstring.

    Args:
        path: the PSI file; a cgroup v2 ``cpu.pressure`` works too.
        clock: monotonic seconds, the readings' ``at``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = PSI_CPU_PATH,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(os.fspath(path), clock)

    _expected = "a line 'some ... total=<microseconds>'"

    def _parse(self, data: bytes) -> tuple[float, float | None] | None:
        total = _some_total(data)
        return None if total is None else (total / 1e6, None)

    def __repr__(self) -> str:
        return f"PsiCpuPressure({self.path!r})"


def _some_total(data: bytes) -> int | None:
    """The ``total`` of the ``some`` line of a PSI file, in microseconds; None if the
    content is not that."""
    for line in data.splitlines():
        fields = line.split()
        if not fields or fields[0] != b"some":
            continue
        for field in fields[1:]:
            key, sep, value = field.partition(b"=")
            if key == b"total" and sep and value.isdigit():
                return int(value)
        return None
    return None


def busy_share(before: PressureReading | None, after: PressureReading | None) -> float | None:
    """The share, in [0, 1], of the time between two readings the thread was running
    or waiting for a CPU (not blocked nor sleeping); None if unknown (PSI knows no
    thread) or the readings span no time."""
    if before is None or after is None or before.busy is None or after.busy is None:
        return None
    wall = after.at - before.at
    busy = after.busy - before.busy
    if not (wall > 0 and math.isfinite(wall) and math.isfinite(busy)):
        return None
    return min(1.0, max(0.0, busy / wall))


def stall_share(before: PressureReading | None, after: PressureReading | None) -> float | None:
    """The share, in [0, 1], of the time between two readings spent stalled, waiting
    for a CPU; None if either is unknown or they span no time.

    Clamped: the counter and the clock are read a moment apart, so a fully stalled
    interval can come out a little above 1 (and a counter that went back, below 0).
    """
    if before is None or after is None:
        return None
    wall = after.at - before.at
    stalled = after.stalled - before.stalled
    if not (wall > 0 and math.isfinite(wall) and math.isfinite(stalled)):
        return None
    return min(1.0, max(0.0, stalled / wall))
