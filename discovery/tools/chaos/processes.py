"""The processes of a chaos run: each server a :class:`Member`, started, signalled and
stopped by :class:`Processes`, with the hostile faults' helper processes beside them.

Every process runs in a session of its own (our Ctrl-C is ours, its signals its own) and
appends to ``logs/<name>.log``. Data servers and helpers run at
:data:`BACKGROUND_NICENESS`: they stand in for other machines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from discovery.testing.netns import Host
from discovery.testing.ports import LOOPBACK

__all__ = ["BACKGROUND_NICENESS", "Member", "Processes", "deprioritize"]

log = logging.getLogger(__name__)

STOP_TIMEOUT = 10.0
#: The niceness of data servers and ZooKeeper. On one 2-core machine they stand in for
#: other machines: in production a data server starting up (imports, index build) or a
#: ZooKeeper JVM warming up does not take CPU from the search servers, whose deadlines
#: invariant 1 judges, nor from the client that measures them. Redis (and, with
#: sentinels, its replicas and the sentinels) keeps the default priority: it uses
#: little CPU, and the failover bound judges the sentinels' own timing.
BACKGROUND_NICENESS = 10


def deprioritize(pid: int, niceness: int = BACKGROUND_NICENESS) -> None:
    """Lower ``pid``'s CPU priority: its autogroup's and every thread's niceness.

    Linux (with ``sched_autogroup_enabled``) first shares the CPU fairly between
    autogroups, one per session, and applies a thread's niceness only within its
    group; our processes each run in a session of their own, so the group's niceness
    is what counts. Threads started later inherit theirs from their parent thread.
    """
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{niceness}\n", encoding="ascii")
    try:
        tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return  # already gone
    for tid in tids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.setpriority(os.PRIO_PROCESS, tid, niceness)


@dataclass
class Member:
    """One data or search server process: how to start it and what state it is in."""

    name: str
    port: int
    argv: list[str]
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    paused: bool = False
    #: Answers ``GET /readyz`` since its last start: only then does the load use it, as a
    #: load balancer's health check would.
    ready: bool = False
    #: Sent SIGKILL or SIGTERM: out of the load until it is started again.
    stopping: bool = False
    restarts: int = 0
    #: Bumped by every kill, pause or restart: a query in flight across a change of it
    #: was disturbed by the harness, not by the system.
    disturbances: int = 0
    #: Bumped by every graceful stop (:meth:`Processes.stop_gracefully`): a query in
    #: flight across one is the system's to finish, and is judged.
    graceful_stops: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: Its network namespace when the run has partitions (None: the root namespace).
    host: Host | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def address(self) -> str:
        return self.host.address if self.host is not None else LOOPBACK

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"


class Processes:
    """Start, signal and stop the run's members and helpers; ``aclose()`` stops them all.

    ``search`` and ``data`` are the run's members by name (the caller's dicts, read as
    they are at each call). ``command(member)`` is a member's command line after the
    interpreter; ``ready(member)`` asks a search server's ``GET /readyz`` once (False if
    it does not answer yet). A process that will not exit within ``STOP_TIMEOUT`` of
    SIGTERM is killed, with a warning.
    """

    def __init__(
        self,
        logs: Path,
        search: Mapping[str, Member],
        data: Mapping[str, Member],
        command: Callable[[Member], list[str]],
        ready: Callable[[Member], Awaitable[bool]],
    ) -> None:
        self._logs = logs
        self._search = search
        self._data = data
        self._command = command
        self._ready = ready
        self._readiness: set[asyncio.Task[None]] = set()
        #: Processes of hostile faults (a hostile peer, a query storm) by name.
        self.helpers: dict[str, asyncio.subprocess.Process] = {}

    def log_path(self, name: str) -> Path:
        """Where the process ``name`` (a member or a helper) logs."""
        return self._logs / f"{name}.log"

    async def aclose(self) -> None:
        """Stop every member (SIGCONT first: a paused process cannot exit) and helper."""
        members = [m for m in [*self._search.values(), *self._data.values()] if m.running]
        for member in members:
            if member.paused:
                self.signal(member, signal.SIGCONT)
        for task in list(self._readiness):
            task.cancel()
        await asyncio.gather(*self._readiness, return_exceptions=True)
        await asyncio.gather(*(self.terminate(member) for member in members))
        await asyncio.gather(*(self.stop_helper(name) for name in list(self.helpers)))

    # -- members -----------------------------------------------------------------

    async def spawn(self, member: Member) -> None:
        """Start ``member``'s process (again), appending to its log."""
        argv = [sys.executable, *self._command(member)]
        if member.host is not None:
            argv = member.host.wrap(argv)  # ip netns exec execs: same pid
        if member.name in self._data:
            argv = ["nice", "-n", str(BACKGROUND_NICENESS), *argv]  # nice execs: same pid
        with member.log_path.open("ab") as out:
            member.process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                # Its own process group: our Ctrl-C is ours, its signals are its own.
                start_new_session=True,
            )
        member.paused = False
        member.ready = False
        member.stopping = False
        if member.name in self._data:
            deprioritize(member.process.pid)
        if member.name in self._search:
            task = asyncio.create_task(self._await_ready(member), name=f"ready:{member.name}")
            self._readiness.add(task)
            task.add_done_callback(self._readiness.discard)

    async def _await_ready(self, member: Member) -> None:
        process = member.process
        while member.process is process and member.running:
            if await self._ready(member):
                member.ready = not member.stopping
                return
            # Polling a starting process: there is no event to wait for from outside.
            await asyncio.sleep(0.1)

    def signal(self, member: Member, signum: int) -> None:
        process = member.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)
        if signum in (signal.SIGSTOP, signal.SIGKILL, signal.SIGTERM):
            member.disturbances += 1
        if signum in (signal.SIGKILL, signal.SIGTERM):
            # Out of the load at once, as a load balancer takes out a server it stops:
            # until the process is reaped it still counts as running, and a query sent to
            # it meanwhile failed on a refused connection that no system could avoid (CI
            # counted one such "failed" query in a leader kill).
            member.ready = False
            member.stopping = True
        if signum == signal.SIGSTOP:
            member.paused = True
        elif signum == signal.SIGCONT:
            member.paused = False

    async def kill(self, member: Member) -> None:
        """``kill -9`` and reap."""
        self.signal(member, signal.SIGKILL)
        if member.process is not None:
            await member.process.wait()
        member.paused = False

    async def terminate(self, member: Member) -> None:
        process = member.process
        if process is None or process.returncode is not None:
            return
        self.signal(member, signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_TIMEOUT):
                await process.wait()
        except TimeoutError:
            log.warning("%s did not stop within %gs; killing it", member.name, STOP_TIMEOUT)
            await self.kill(member)

    async def stop_gracefully(self, member: Member, bound: float) -> float | None:
        """SIGTERM ``member`` as a deployment stops it and wait for it to exit: the
        seconds it took, or None if it was still running after ``bound`` s (it is then
        killed, which disturbs the queries in flight as any kill does).

        Unlike :meth:`signal`, this is no disturbance: the server's own shutdown (a
        search server fails its readiness and finishes the queries in flight; a data
        server drains) is what is being tested, so a query in flight across it is
        judged. New queries stop going to it at once, as a load balancer takes out a
        server it stops.
        """
        process = member.process
        if process is None or process.returncode is not None:
            return 0.0
        member.graceful_stops += 1
        member.ready = False
        member.stopping = True
        loop = asyncio.get_running_loop()
        started = loop.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(bound):
                await process.wait()
        except TimeoutError:
            log.warning("%s did not stop within %gs of SIGTERM; killing it", member.name, bound)
            await self.kill(member)
            return None
        return loop.time() - started

    async def restart(self, member: Member) -> None:
        if member.running:
            await self.kill(member)
        member.restarts += 1
        await self.spawn(member)

    # -- helpers -----------------------------------------------------------------

    async def spawn_helper(self, name: str, argv: list[str]) -> asyncio.subprocess.Process:
        """Start a process of a hostile fault (``argv`` after the interpreter) in the root
        namespace, at the data servers' niceness (it stands in for another machine, as
        they do), logging to ``logs/<name>.log``."""
        command = ["nice", "-n", str(BACKGROUND_NICENESS), sys.executable, *argv]
        with self.log_path(name).open("ab") as out:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        deprioritize(process.pid)
        self.helpers[name] = process
        return process

    async def stop_helper(self, name: str) -> int | None:
        """SIGTERM a helper (SIGKILL if it does not exit in time) and reap it; its exit
        status (None if there was no such helper)."""
        process = self.helpers.pop(name, None)
        if process is None:
            return None
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                async with asyncio.timeout(STOP_TIMEOUT):
                    await process.wait()
            except TimeoutError:
                log.warning("%s did not stop within %gs; killing it", name, STOP_TIMEOUT)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        return process.returncode
