"""Leader election among search servers: kazoo's election recipe in a thread of its own.

Each term is a cancellable asyncio task on the loop, never code in kazoo's threads or
the election's; its epoch is the election node's czxid. On SUSPENDED the term goes on
(it must stop writing itself), on LOST it is cancelled at once; when it ends, the node
is released and the election contends again.

Design: docs/design/zookeeper.md, "The election's thread".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionClosedError, KazooException, SessionExpiredError
from kazoo.recipe.election import Election

from discovery.errors import DiscoveryError
from discovery.zk.session import SessionEvent, SessionState, ZkSession

__all__ = ["LeaderElection", "Leadership"]

log = logging.getLogger(__name__)

# Pause before contending again after an unexpected recipe error, so that a
# persistent failure (an ACL problem, say) does not spin.
_RETRY_PAUSE = 1.0
# How often an ending term that has not stopped yet is cancelled again.
_TERM_NUDGE = 1.0


@dataclass(frozen=True)
class Leadership:
    """One term of leadership: its fencing ``epoch`` and the election node's path."""

    epoch: int
    node: str
    session_id: int


class LeaderElection:
    """Contend for leadership under ``path`` for as long as this object is open.

    ``lead(leadership)`` is awaited on the event loop each time we win; it should run
    until cancelled (LOST, close) or return/raise to give leadership up.
    """

    def __init__(
        self,
        session: ZkSession,
        path: str,
        identifier: str,
        lead: Callable[[Leadership], Coroutine[Any, Any, None]],
    ) -> None:
        self._session = session
        self.path = path
        self.identifier = identifier
        self._lead = lead
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._connected = threading.Event()
        self._election: Election | None = None
        self._task: asyncio.Task[None] | None = None
        # The term being cancelled (LOST, close), until it has really ended.
        self._ending: asyncio.Task[None] | None = None
        self._current: Leadership | None = None
        self._terms = 0

    # -- state, on the loop -------------------------------------------------------

    @property
    def leadership(self) -> Leadership | None:
        """The current term while we lead, else None."""
        return self._current

    @property
    def is_leader(self) -> bool:
        return self._current is not None

    @property
    def terms(self) -> int:
        """How many times we have won so far."""
        return self._terms

    async def contenders(self) -> list[str]:
        """Identifiers of all contenders, the leader first (a ZooKeeper read)."""
        election = Election(self._session.client, self.path, self.identifier)
        result: list[str] = await asyncio.to_thread(election.contenders)
        return result

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Join the election (returns at once; leadership comes when it comes)."""
        self._loop = asyncio.get_running_loop()
        self._session.add_listener(self._on_session_event)
        if self._session.connected:
            self._connected.set()
        self._thread = threading.Thread(
            target=self._contend, name=f"election:{self.identifier}", daemon=True
        )
        self._thread.start()

    async def aclose(self) -> None:
        """Leave the election; if leading, cancel the leadership task and release.

        A leader deletes its election node itself, right after cancelling its term,
        rather than when the recipe releases it: that happens only once the term's
        teardown (watcher, subscriptions) has finished, which can take hundreds of
        milliseconds on a busy loop, and the next leader waits for the node. Writes
        still in flight from the ending term are refused by the new, higher epoch.
        """
        self._closing.set()
        self._connected.set()  # wake the thread if it waits for a connection
        election = self._election
        if election is not None:
            election.cancel()
        current = self._current
        self._cancel_leadership()
        if current is not None and self._session.session_id == current.session_id:
            try:
                await self._session.delete(current.node)
            except DiscoveryError as exc:
                # NoNode included: the recipe (or the session's end) released it first.
                log.debug("%s: early release of %s: %s", self.identifier, current.node, exc)
        self._session.remove_listener(self._on_session_event)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)
            if self._thread.is_alive():
                log.warning("election thread of %s did not stop", self.identifier)
            self._thread = None

    async def __aenter__(self) -> LeaderElection:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _on_session_event(self, event: SessionEvent) -> None:
        if event.state is SessionState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        if event.state is SessionState.LOST and self._task is not None:
            log.warning("%s: session lost while leading; resigning", self.identifier)
            self._cancel_leadership()

    def _cancel_leadership(self) -> None:
        task = self._task
        if task is None or self._loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            self._loop.call_soon_threadsafe(self._end_term, task)

    def _end_term(self, task: asyncio.Task[None]) -> None:
        self._ending = task
        task.cancel()

    # -- the election thread -----------------------------------------------------

    def _contend(self) -> None:
        while not self._closing.is_set():
            self._connected.wait()
            if self._closing.is_set():
                break
            # Read anew each time: the session replaces its client when it declares a
            # session lost (see ZkSession), and the old one is stopped.
            client = self._session.client
            # A fresh recipe object per attempt: kazoo's lock remembers its last node.
            election = Election(client, self.path, self.identifier)
            self._election = election
            try:
                election.run(self._hold, election)
            except SessionExpiredError as exc:
                # Connected, yet the ensemble has closed the session: only a new client
                # gets a new session (ZkSession.report_expired replaces it).
                log.warning("%s: election attempt failed: %s", self.identifier, exc)
                self._report_expired(client, exc)
                self._closing.wait(_RETRY_PAUSE)
            except KazooException as exc:
                log.warning("%s: election attempt failed: %s", self.identifier, exc)
                self._closing.wait(_RETRY_PAUSE)
            except Exception:
                log.exception("%s: election attempt crashed", self.identifier)
                self._closing.wait(_RETRY_PAUSE)
            finally:
                self._election = None

    def _report_expired(self, client: KazooClient, exc: SessionExpiredError) -> None:
        if isinstance(exc, ConnectionClosedError) or self._loop is None:
            return  # a client stopped on purpose, not an expiry
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            self._loop.call_soon_threadsafe(self._session.report_expired, client)

    def _hold(self, election: Election) -> None:
        """Called by the recipe in our thread while we hold the lowest node."""
        if self._closing.is_set() or self._loop is None:
            return
        node = f"{self.path}/{election.lock.node}"
        client = self._session.client
        # Blocking ZooKeeper reads are fine here: this is our own thread, not the loop
        # and not kazoo's.
        stat = client.exists(node)
        client_id = client.client_id
        if stat is None or client_id is None:
            return  # lost the node already: contend again
        leadership = Leadership(epoch=stat.czxid, node=node, session_id=client_id[0])
        future = asyncio.run_coroutine_threadsafe(self._run_leadership(leadership), self._loop)
        with contextlib.suppress(concurrent.futures.CancelledError):
            future.result()

    async def _run_leadership(self, leadership: Leadership) -> None:
        if self._closing.is_set() or not self._session.connected:
            return
        self._terms += 1
        self._current = leadership
        log.info("%s leads with epoch %d (%s)", self.identifier, leadership.epoch, leadership.node)
        self._task = asyncio.create_task(
            self._lead(leadership), name=f"leadership:{self.identifier}:{leadership.epoch}"
        )
        task = self._task
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=_TERM_NUDGE)
                if self._ending is task and not task.done():
                    # The term's code called a library that swallowed the cancellation
                    # (see discovery.aio): ask again, or a lost leader would go on.
                    log.warning("%s: the ending term ignored its cancellation", self.identifier)
                    task.cancel()
        except asyncio.CancelledError:
            task.cancel()  # we ourselves are being cancelled: the term goes with us
            raise
        finally:
            self._task = None
            self._current = None
            self._ending = None
        if task.cancelled():
            log.info("%s: leadership of epoch %d cancelled", self.identifier, leadership.epoch)
        elif task.exception() is not None:
            log.error(
                "%s: leadership of epoch %d ended with an error",
                self.identifier,
                leadership.epoch,
                exc_info=task.exception(),
            )
        else:
            log.info("%s gave up leadership of epoch %d", self.identifier, leadership.epoch)
