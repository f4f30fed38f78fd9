"""The process discipline shared by the local ZooKeeper and Redis servers.

:class:`ManagedProcess` runs one server with its output in a log file, polls readiness
with a deadline, and ``stop()`` always reaps the child, escalating from SIGTERM to SIGKILL.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from discovery.errors import DevClusterError

__all__ = ["ManagedProcess", "log_tail", "log_tails", "remaining", "terminate_all"]

logger = logging.getLogger(__name__)

# Readiness probes run this often; JVM start-up takes about a second, so finer polling
# would only burn CPU that the starting servers need.
_POLL_INTERVAL_S = 0.05
_TAIL_LINES = 30
_TAIL_BYTES = 64 * 1024


def remaining(deadline: float) -> float:
    """Seconds left until ``deadline`` (``time.monotonic()``), never negative."""
    return max(0.0, deadline - time.monotonic())


def log_tails(processes: Iterable[ManagedProcess], lines: int = 12) -> str:
    """The last ``lines`` of each process's log, headed by its name and pid (for the
    error message of a group of servers that failed to come up)."""
    return "\n".join(
        f"--- {p.name} (pid {p.pid}), last lines of {p.log_path}:\n{log_tail(p.log_path, lines)}"
        for p in processes
    )


def log_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    """Return the last ``lines`` lines of a log file, or a note if it cannot be read.

    Never raises: it is used while building error messages.
    """
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _TAIL_BYTES))
            data = f.read()
    except OSError as exc:
        return f"(log {path} unreadable: {exc})"
    text = data.decode("utf-8", errors="replace").rstrip("\n")
    if not text:
        return f"(log {path} is empty)"
    return "\n".join(text.splitlines()[-lines:])


class ManagedProcess(abc.ABC):
    """One local server process started in its own directory, with output in a log file.

    Subclasses say how to prepare the directory, which command to run and how to probe
    readiness. ``start()`` returns once the probe succeeds (``start(wait=False)`` only
    launches, so several servers can boot in parallel before ``wait_ready()``). ``stop()``
    is idempotent and always reaps the child.
    """

    def __init__(self, name: str, workdir: Path, log_path: Path) -> None:
        self._name = name
        # Absolute, because the process runs with its work directory as cwd and would
        # resolve relative paths in its own configuration against that.
        self._workdir = workdir.absolute()
        self._log_path = log_path.absolute()
        self._proc: subprocess.Popen[bytes] | None = None

    @abc.abstractmethod
    def _command(self) -> list[str]:
        """Return the argv to run; raise ``DevClusterError`` if the program is missing."""

    @abc.abstractmethod
    def _probe(self) -> bool:
        """Return True if the server answers as ready; must not raise for "not yet"."""

    def _prepare(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Write configuration files into the work directory before each start."""

    @property
    def name(self) -> str:
        """A short name for messages, e.g. ``zookeeper-1``."""
        return self._name

    @property
    def workdir(self) -> Path:
        """The directory holding this server's configuration, data and log."""
        return self._workdir

    @property
    def log_path(self) -> Path:
        """The file receiving the process's stdout and stderr (appended across restarts)."""
        return self._log_path

    @property
    def running(self) -> bool:
        """True while the process has been started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The process id while started (even if it has just exited unreaped), else None."""
        return self._proc.pid if self._proc is not None else None

    def start(self, *, wait: bool = True, timeout: float = 30.0) -> None:
        """Launch the process and, with ``wait``, block until it is ready.

        ``wait=False`` only launches it, so several servers can boot in parallel before
        ``wait_ready()``. Raises ``DevClusterError`` if it is already running, its directory
        cannot be written, it cannot be executed, or (with ``wait``) it is not ready within
        ``timeout`` seconds, in which case it is stopped first. A previous process that
        exited on its own is reaped.
        """
        if self.running:
            raise DevClusterError(f"{self._name} is already running (pid {self.pid})")
        self.stop()
        argv = self._command()
        try:
            self._workdir.mkdir(parents=True, exist_ok=True)
            self._prepare()
        except OSError as exc:
            raise DevClusterError(
                f"cannot prepare {self._workdir} for {self._name}: {exc}"
            ) from exc
        try:
            # Appending keeps the history of earlier runs for post-mortems after restarts.
            with self._log_path.open("ab") as log:
                log.write(f"--- starting: {shlex.join(argv)}\n".encode())
                log.flush()
                # A new session keeps a terminal's Ctrl+C away from the servers: the owner
                # stops them in order, instead of racing a signal that reached everyone.
                self._proc = subprocess.Popen(
                    argv,
                    cwd=self._workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as exc:
            raise DevClusterError(f"cannot start {self._name} ({argv[0]}): {exc}") from exc
        logger.debug("started %s, pid %d, log %s", self._name, self._proc.pid, self._log_path)
        if wait:
            try:
                self.wait_ready(timeout)
            except BaseException:
                self.stop()
                raise

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the readiness probe succeeds.

        Raises ``DevClusterError`` with the tail of the log if the process is not started,
        exits, or is not ready within ``timeout`` seconds. The process is left as it is;
        the caller decides whether to ``stop()`` it.
        """
        deadline = time.monotonic() + timeout
        while True:
            proc = self._proc
            if proc is None:
                raise DevClusterError(f"{self._name} is not started")
            code = proc.poll()
            if code is not None:
                raise DevClusterError(
                    f"{self._name} exited with code {code} before it was ready; "
                    f"last lines of {self._log_path}:\n{log_tail(self._log_path)}"
                )
            if self._probe():
                logger.debug("%s is ready", self._name)
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DevClusterError(
                    f"{self._name} (pid {proc.pid}) was not ready within {timeout:g} s; "
                    f"last lines of {self._log_path}:\n{log_tail(self._log_path)}"
                )
            time.sleep(min(_POLL_INTERVAL_S, remaining))

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the process: SIGTERM, wait up to ``timeout`` seconds, then SIGKILL.

        Idempotent; a no-op if never started. The child is always reaped, even if waiting is
        interrupted (the interruption then propagates after a SIGKILL).
        """
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    logger.warning(
                        "%s (pid %d) ignored SIGTERM for %g s; killing it",
                        self._name,
                        proc.pid,
                        timeout,
                    )
                    proc.kill()
                    proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                proc.wait()
            self._proc = None
        logger.debug("stopped %s (pid %d, exit code %s)", self._name, proc.pid, proc.returncode)

    def restart(self, timeout: float = 30.0) -> None:
        """Stop the process, start it again with the same ports and files, and wait until it
        is ready.

        Raises ``DevClusterError`` like ``start()``, which leaves the process stopped.
        """
        self.stop()
        self.start(timeout=timeout)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name} pid={self.pid} dir={self._workdir}>"


async def terminate_all(
    processes: Sequence[asyncio.subprocess.Process | None], timeout: float = 20.0
) -> None:
    """Stop asyncio child processes: SIGTERM to all (a server drains on it), then wait
    for each up to ``timeout`` seconds and SIGKILL the ones still running. Those already
    gone (or None) are skipped; every one is reaped."""
    alive = [p for p in processes if p is not None and p.returncode is None]
    for process in alive:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    for process in alive:
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            logger.warning("pid %d ignored SIGTERM for %g s; killing it", process.pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
