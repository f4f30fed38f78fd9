"""An asyncio event loop running in a thread of its own, for the agent.

Other threads talk to it only through thread-safe calls (:meth:`LoopThread.submit`).
One ``LoopThread`` can host many agents: a fleet process shares one.

Design: docs/design/data-server.md, "Its own thread and loop".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class LoopThread:
    """Run an event loop in a daemon thread until :meth:`stop`.

    Daemon, so that a process whose main thread died is not kept alive by it; the
    owner is still expected to call :meth:`stop`, which cancels the tasks left on the
    loop and waits for them.
    """

    def __init__(self, name: str = "discovery-agent") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError(f"{self._name} is not started")
        return self._loop

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread and return once its loop is running. Idempotent."""
        if self.running:
            return
        self._started.clear()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        self._started.wait()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        loop.call_soon(self._started.set)
        try:
            loop.run_forever()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on this loop from any thread; returns a concurrent future.

        From asyncio code on another loop, ``await asyncio.wrap_future(...)`` it.
        """
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on this loop and wait for its result (not from this loop's thread).

        Raises:
            RuntimeError: called from the loop's own thread (it would deadlock).
            TimeoutError: no result within ``timeout``; the coroutine is cancelled.
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("LoopThread.run() called from its own thread")
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result from {self._name} within {timeout}s") from None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop (cancelling what still runs on it) and join the thread."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        with contextlib.suppress(RuntimeError):  # already closed
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("%s did not stop within %gs", self._name, timeout)
        self._thread = None
