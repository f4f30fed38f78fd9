"""Keep one ephemeral znode per service instance for as long as it is wanted.

A :class:`Registration` creates its node again after an expiry, a deletion by someone
else, or a zombie session its read-backs uncover, and retries a failed deregister at
the next reconnect. It never takes a node that a live foreign session owns: that
conflict is raised (:class:`~discovery.errors.RegistrationConflictError`) and reported
loudly, and the node is claimed once the other goes. :class:`Removal` says how it goes.

Design: docs/design/zookeeper.md, "Registration".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Final

from prometheus_client import CollectorRegistry

from discovery.errors import (
    InvalidInstanceError,
    RegistrationConflictError,
    ZkConnectionError,
    ZkError,
)
from discovery.instance import ServiceInstance
from discovery.metrics import RegistrationMetrics
from discovery.zk.claim import NodeClaim
from discovery.zk.conflict import ConflictTracker
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.readback import ReadBackSchedule
from discovery.zk.removal import NodeRemover, Removal
from discovery.zk.session import SessionEvent, SessionState, WatchEvent, ZkSession

__all__ = ["Registration", "Removal"]

log = logging.getLogger(__name__)

# Pause between retries while connected but failing.
_RETRY_INTERVAL: Final = 1.0
# Seconds after each connection at which the node is read back (nominal, each drawn
# in 0.5x-1.5x): a zombie session (a reconnection that raced the session's close)
# shows as a missing node once the ensemble's delete has reached our server.
VERIFY_AFTER_CONNECT = (2.0, 10.0, 30.0)
# While another session holds our id: how often we look again.
_CONFLICT_RECHECK: Final = 30.0


class Registration:
    """The ephemeral registration of one :class:`ServiceInstance`.

    Use as ``async with Registration(session, instance) as reg:`` (registers on
    entry, deregisters on exit) or call :meth:`register` / :meth:`deregister` /
    :meth:`aclose` yourself. The session must be started. ``removal`` says how the
    node is removed (see :class:`Removal`); the default deletes it. While another
    session holds our id, we look again every ``conflict_recheck`` seconds; a node
    with our address and port that we cannot delete is taken for a stale one of ours
    for ``stale_grace`` seconds of ``clock``, and for a squatter's after that. With
    ``verify_interval`` the node is read back that long (jittered by ``rng``) after
    the last read-back, and ``verify_after_connect`` seconds after each connection
    (see docs/design/zookeeper.md, "Registration"; ``()`` for none).
    """

    def __init__(
        self,
        session: ZkSession,
        instance: ServiceInstance,
        *,
        base_path: str = DATA_SERVERS_PATH,
        registry: CollectorRegistry | None = None,
        removal: Removal = Removal.DELETE,
        verify_interval: float | None = None,
        stale_grace: float = 120.0,
        conflict_recheck: float = _CONFLICT_RECHECK,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        verify_after_connect: Sequence[float] = VERIFY_AFTER_CONNECT,
    ) -> None:
        self._session = session
        self._conflict_recheck = conflict_recheck
        self.path = f"{base_path.rstrip('/')}/{instance.id}"
        metrics = RegistrationMetrics(registry if registry is not None else CollectorRegistry())
        # Who owns the node and why not we (claim, conflicts), how it is removed, and
        # when it is read back; this class decides when each acts.
        self._conflicts = ConflictTracker(
            self.path, metrics, stale_grace=stale_grace, clock=clock, on_blocked=self._recheck_soon
        )
        self._claim = NodeClaim(
            session,
            self.path,
            instance,
            metrics,
            self._conflicts,
            on_node_event=self._on_node_event,
        )
        self._remover = NodeRemover(session, self.path, removal)
        self._readback = ReadBackSchedule(
            verify_interval, verify_after_connect, rng if rng is not None else random.Random()
        )
        self._wanted = False
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # The running task's wait for its next wake-up or due check.
        self._due: asyncio.Timeout | None = None

    @property
    def instance(self) -> ServiceInstance:
        return self._claim.instance

    @property
    def registered(self) -> bool:
        """True while our node exists and belongs to the current session (as last seen)."""
        return self._claim.registered

    async def settled(self) -> bool:
        """Wait for a register, update or deregister in progress; then :attr:`registered`.

        :attr:`registered` alone is False while a create is on its way, although the
        node may already exist and be seen by others: a caller about to announce a
        departure asks this instead, so the node that create makes is announced too.
        """
        async with self._lock:
            return self.registered

    @property
    def conflict(self) -> RegistrationConflictError | None:
        """The last ownership conflict, while it lasts."""
        return self._conflicts.conflict

    async def register(self) -> None:
        """Create our node and keep it until :meth:`deregister`.

        Raises:
            RegistrationConflictError: another live session owns the id; we keep
                watching and register once its node disappears.
            ZkConnectionError: not connected; the node is created at reconnect.
        """
        self._wanted = True
        self._ensure_task()
        await self._reconcile()
        conflict = self._conflicts.conflict
        if conflict is not None:
            raise conflict

    async def update(self, instance: ServiceInstance) -> None:
        """Replace the published instance (same id), in place if registered.

        Raises:
            InvalidInstanceError: the id differs or the document is too large.
            ZkConnectionError: not connected; the new data is written at reconnect.
        """
        current = self._claim.instance
        if instance.id != current.id:
            raise InvalidInstanceError(
                f"cannot change the id of a registration ({current.id!r} -> {instance.id!r})"
            )
        self._claim.instance = instance
        if self._wanted:
            await self._reconcile()

    async def deregister(self, *, final: bool = False) -> None:
        """Remove our node (only if it is ours) and stop re-creating it.

        The node is deleted, or, where the ACL refuses that (see :class:`Removal`),
        the session is ended and a new one opened; the node is gone when this returns.
        ``final``: nothing will use the session afterwards (a drain before the stop):
        where the session must end, it is closed, and no new one opened.

        Raises:
            ZkConnectionError: not connected; the node is removed at reconnect, or
                by ZooKeeper when the session ends (also: the new session is not up
                yet after ending the old one; the old node is gone all the same).
            ZkAuthError: under ``Removal.DELETE``, the ACL refuses the delete.
        """
        self._wanted = False
        self._remover.session_final = final
        await self._reconcile()

    async def aclose(self, *, session_closing: bool = False) -> None:
        """Deregister if possible and stop watching the session.

        ``session_closing``: the caller closes the session right afterwards. A
        registration that removes its node by ending the session then leaves that to
        the close instead of opening a new session first.
        """
        self._remover.session_closing = session_closing
        try:
            if self._wanted:
                await self.deregister()
        except ZkError as exc:
            log.warning("deregistering %s on close failed: %s", self.path, exc)
        finally:
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
                self._task = None

    async def __aenter__(self) -> Registration:
        await self.register()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- reconciliation ---------------------------------------------------------

    def _ensure_task(self) -> None:
        if self._task is None:
            self._session.add_listener(self._on_session_event)
            self._task = asyncio.create_task(self._run(), name=f"registration:{self.path}")
            self._task.add_done_callback(self._on_task_done)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        self._session.remove_listener(self._on_session_event)
        if not task.cancelled() and task.exception() is not None:
            log.error("registration task for %s crashed", self.path, exc_info=task.exception())

    def _on_session_event(self, event: SessionEvent) -> None:
        if event.state is SessionState.CONNECTED:
            self._readback.connected()
            if event.new_session:
                self._claim.on_new_session()
            self._wake.set()
        elif event.state is SessionState.LOST:
            self._claim.on_session_lost()

    def _on_node_event(self, event: WatchEvent) -> None:
        self._wake.set()

    async def _run(self) -> None:
        """Reconcile whenever the session reconnects or our node changes under us."""
        while True:
            if not await self._woken_or_due():
                if self._conflicts.blocked:
                    # Blocked by another session's node: look again (and say so again).
                    await self._reconcile_logged()
                else:
                    await self._verify()
                # The checks due are answered either way (a conflict's reconcile
                # reads the node too): never a hot loop on an overdue check.
                self._readback.done()
                continue
            self._wake.clear()
            if not self._session.connected:
                continue  # the CONNECTED event wakes us again
            if not await self._reconcile_logged():
                # Connected but failing (a slow server, a timeout): try again shortly
                # rather than wait for an event that may never come.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_RETRY_INTERVAL):
                        await self._wake.wait()
                self._wake.set()

    async def _woken_or_due(self) -> bool:
        """Wait for a wake-up (True) or, while the node is wanted, a due check (False)."""
        interval = self._readback.due_in() if self._wanted else None
        if self._wanted and self._conflicts.blocked:
            # (A due check's 0 stays 0: it is not "no check".)
            recheck = self._conflict_recheck
            interval = recheck if interval is None else min(interval, recheck)
        try:
            async with asyncio.timeout(interval) as due:
                self._due = due
                await self._wake.wait()
        except TimeoutError:
            return False
        finally:
            self._due = None
        return True

    def _recheck_soon(self) -> None:
        """Bring the next due check forward to ``conflict_recheck`` from now: a conflict
        found by register() or an event arrives while the task waits without a due time."""
        due = self._due
        if due is None:
            return
        when = asyncio.get_running_loop().time() + self._conflict_recheck
        deadline = due.when()
        if deadline is None or deadline > when:
            due.reschedule(when)

    async def _verify(self) -> None:
        """Read our node back; re-create it if it is gone or no longer ours.

        Only what we believe is checked: while we know we are not registered (not
        connected, a conflict, a stale node we wait out), events drive us already.
        """
        # Under the lock: a register, update or deregister in progress may be replacing
        # the node right now, and what it finds decides.
        async with self._lock:
            if not (self._session.connected and self._wanted and self.registered):
                return
            if not await self._claim.verify():
                return
        self._wake.set()

    async def _reconcile_logged(self) -> bool:
        try:
            await self._reconcile()
        except ZkConnectionError as exc:
            log.info("reconciling %s deferred: %s", self.path, exc)
            return False
        except ZkError as exc:
            log.error("reconciling %s failed: %s", self.path, exc)
            return False
        except Exception:
            # A bug of ours or of kazoo's must not end the registration for good: the
            # task would die and the node never come back. Logged, retried.
            log.exception("reconciling %s failed unexpectedly", self.path)
            return False
        return True

    async def _reconcile(self) -> None:
        async with self._lock:
            if self._wanted:
                await self._claim.ensure_present()
            else:
                await self._remover.remove_if_ours()
                self._claim.released()
                # Not wanted: no longer anybody's conflict.
                self._conflicts.forget()
