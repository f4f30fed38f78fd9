"""Keep one ephemeral znode per service instance for as long as it is wanted.

A :class:`Registration` owns ``<base>/<instance-id>``. It creates the node when asked
to register, rewrites it in place when the instance changes (``state: draining``,
say), deletes it when asked to deregister, and reconciles on every reconnect:

* after a session expiry (a CONNECTED event with a new session) the node is gone,
  so it is created again, without any operator action;
* if someone deletes the node while we want it, an existence watch brings us back;
* if a deregister failed because the connection was down, the node is deleted at
  the next reconnect (the session survived, so the node did too);
* with ``verify_interval``, the node is also read back while it is wanted, and
  re-created if it is missing or not ours: a client can stay connected to a session
  the ensemble has closed, and then no event ever tells us that the node went with it
  (the write that re-creates it makes the session find out that it is gone, see
  :class:`~discovery.zk.session.ZkSession`). Such a session comes of a reconnection
  racing the session's close, so the node is read back a few times after every
  connection (about 2, 10 and 30 s after it), and otherwise only in a slow sweep
  (every ``verify_interval``); each wait is drawn at random between half and one and
  a half times its nominal length, so that a fleet reconnected at once by a server's
  restart does not read back in one burst. At 50,000 data servers a sweep of 120 s
  costs the ensemble about 420 reads a second, where a read every 10 s cost 5,000.

Ownership is decided by the node's ``ephemeralOwner``. A node owned by our current
session is ours. A node owned by a session this object held before, or one that
carries our own address and port (an earlier incarnation of this very server, whose
session has not timed out yet: nobody else can be listening on our port), is stale
and is replaced. Any other owner is a live foreign session: we refuse to steal the
node, count a conflict, raise :class:`~discovery.errors.RegistrationConflictError`
from :meth:`register`, and keep watching the path so that we register as soon as
the other owner's node goes away.

A conflict is reported loudly, never retried in silence: an ERROR when it starts and
again every minute while it lasts, ``discovery_registration_conflicted`` at 1, and
:attr:`Registration.conflict` (which the agent's status shows). Another identity that
can create nodes under ``/data_servers`` can *squat* an id: create its node before
the real server does (after its restart, say), even with the real server's address
and port so that it looks like a stale node of ours. Such a look-alike that we cannot
delete and that outlives ``stale_grace`` (longer than any session of ours can
outlive its process) is reported as a conflict too. Ids another identity cannot
predict (a per-start random suffix, or ZooKeeper ACLs per identity) make squatting
impossible; see ``docs/ARCHITECTURE.md``.

How the node is removed is a :class:`Removal`. Deleting it needs DELETE on the
*parent* in ZooKeeper, which the access-controlled tree of :mod:`discovery.zk.acl`
does not give data servers (it would let one delete every other's node). Such a
registration removes its node by ending its session instead: ZooKeeper deletes the
session's ephemeral nodes, and only those, without an ACL check, and a new session is
opened at once so that coming back online is one create. A stale node of an earlier
incarnation cannot be removed either then: we wait, watching it, until ZooKeeper
expires its session.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry

from discovery.errors import (
    InvalidInstanceError,
    RegistrationConflictError,
    ZkAuthError,
    ZkBadVersionError,
    ZkConnectionError,
    ZkError,
    ZkNodeExistsError,
    ZkNoNodeError,
)
from discovery.instance import ServiceInstance
from discovery.metrics import RegistrationMetrics
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.session import SessionEvent, SessionState, WatchEvent, ZkSession

__all__ = ["Registration", "Removal"]

log = logging.getLogger(__name__)

# Create/replace races (a stale node deleted under us, a node vanishing between
# NodeExists and our read) resolve in a step or two; more means something is
# fighting us, which is reported rather than looped on.
_MAX_ATTEMPTS = 5
# Pause between retries while connected but failing.
_RETRY_INTERVAL = 1.0
# Seconds after each connection at which the node is read back (nominal, each drawn
# in 0.5x-1.5x): a zombie session (a reconnection that raced the session's close)
# shows as a missing node once the ensemble's delete has reached our server.
VERIFY_AFTER_CONNECT = (2.0, 10.0, 30.0)
# While another session holds our id: how often we look again, and how often the error
# is repeated. A conflict is never waited out in silence: it is a duplicate --id or
# someone squatting ours, and either way an operator must act.
_CONFLICT_RECHECK = 30.0
_CONFLICT_REMINDER = 60.0


class Removal(enum.Enum):
    """How a :class:`Registration` removes its node when deregistering."""

    #: Delete the node (needs DELETE on its parent).
    DELETE = "delete"
    #: End the session (ZooKeeper removes its ephemeral nodes with no ACL check) and
    #: open a new one. Only for a session that nothing but this registration uses.
    END_SESSION = "end_session"
    #: Delete; once the parent's ACL refuses that, end the session from then on.
    #: Only for a session that nothing but this registration uses.
    AUTO = "auto"


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
    (see the module's docstring; ``()`` for none).
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
        self._stale_grace = stale_grace
        self._conflict_recheck = conflict_recheck
        self._clock = clock
        self._verify_interval = verify_interval
        self._removal = removal
        # Deregistering ends the session: always under END_SESSION, and under AUTO
        # once the ACL has refused a delete (it will go on refusing).
        self._delete_refused = removal is Removal.END_SESSION
        self._session_closing = False
        self._instance = instance
        self._data = instance.to_json()
        self.path = f"{base_path.rstrip('/')}/{instance.id}"
        self._metrics = RegistrationMetrics(
            registry if registry is not None else CollectorRegistry()
        )
        self._wanted = False
        self._owned_session: int | None = None
        self._past_sessions: set[int] = set()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._ever_registered = False
        self._conflict: RegistrationConflictError | None = None
        self._conflict_since = 0.0
        self._last_reminder = 0.0
        # Look-alike nodes (our address and port) we could not delete: owner -> first seen.
        self._stale_since: dict[int, float] = {}
        # The running task's wait for its next wake-up or due check.
        self._due: asyncio.Timeout | None = None
        # When the node is next read back (the loop's clock): the checks after the
        # last connection, and the sweep. Jittered by _rng.
        self._rng = rng if rng is not None else random.Random()
        self._after_connect = tuple(verify_after_connect)
        self._checks: list[float] = []
        self._next_sweep: float | None = None

    @property
    def instance(self) -> ServiceInstance:
        return self._instance

    @property
    def registered(self) -> bool:
        """True while our node exists and belongs to the current session (as last seen)."""
        return self._owned_session is not None and self._owned_session == self._session.session_id

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
        return self._conflict

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
        if self._conflict is not None:
            raise self._conflict

    async def update(self, instance: ServiceInstance) -> None:
        """Replace the published instance (same id), in place if registered.

        Raises:
            InvalidInstanceError: the id differs or the document is too large.
            ZkConnectionError: not connected; the new data is written at reconnect.
        """
        if instance.id != self._instance.id:
            raise InvalidInstanceError(
                f"cannot change the id of a registration ({self._instance.id!r} -> {instance.id!r})"
            )
        self._instance = instance
        self._data = instance.to_json()
        if self._wanted:
            await self._reconcile()

    async def deregister(self) -> None:
        """Remove our node (only if it is ours) and stop re-creating it.

        The node is deleted, or, where the ACL refuses that (see :class:`Removal`),
        the session is ended and a new one opened; the node is gone when this returns.

        Raises:
            ZkConnectionError: not connected; the node is removed at reconnect, or
                by ZooKeeper when the session ends (also: the new session is not up
                yet after ending the old one; the old node is gone all the same).
            ZkAuthError: under ``Removal.DELETE``, the ACL refuses the delete.
        """
        self._wanted = False
        await self._reconcile()

    async def aclose(self, *, session_closing: bool = False) -> None:
        """Deregister if possible and stop watching the session.

        ``session_closing``: the caller closes the session right afterwards. A
        registration that removes its node by ending the session then leaves that to
        the close instead of opening a new session first.
        """
        self._session_closing = session_closing
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
        if event.state is SessionState.CONNECTED and self._verify_interval is not None:
            now = asyncio.get_running_loop().time()
            self._checks = sorted(now + self._jittered(delay) for delay in self._after_connect)
        if event.state is SessionState.CONNECTED:
            if event.new_session and self._owned_session is not None:
                # The old session's ephemeral node died with it.
                self._past_sessions.add(self._owned_session)
                self._owned_session = None
                self._metrics.registered.set(0)
            self._wake.set()
        elif event.state is SessionState.LOST:
            # The node went with the session (or goes soon, if the session was only
            # declared lost on our side: see ZkSession's watchdog).
            if self._owned_session is not None:
                self._past_sessions.add(self._owned_session)
                self._owned_session = None
            self._metrics.registered.set(0)

    def _on_node_event(self, event: WatchEvent) -> None:
        self._wake.set()

    async def _run(self) -> None:
        """Reconcile whenever the session reconnects or our node changes under us."""
        while True:
            if not await self._woken_or_due():
                if self._conflict is not None or self._stale_since:
                    # Blocked by another session's node: look again (and say so again).
                    await self._reconcile_logged()
                else:
                    await self._verify()
                # The checks due are answered either way (a conflict's reconcile
                # reads the node too): never a hot loop on an overdue check.
                self._verified()
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

    def _jittered(self, seconds: float) -> float:
        return seconds * self._rng.uniform(0.5, 1.5)

    def _verify_in(self) -> float | None:
        """Seconds until the next read-back is due (None: none while unwanted)."""
        if self._verify_interval is None or not self._wanted:
            return None
        now = asyncio.get_running_loop().time()
        if self._next_sweep is None:
            self._next_sweep = now + self._jittered(self._verify_interval)
        due = min(self._next_sweep, self._checks[0]) if self._checks else self._next_sweep
        return max(0.0, due - now)

    def _verified(self) -> None:
        """A read-back done: the checks it satisfied are over; the sweep starts again
        when it was the one due."""
        now = asyncio.get_running_loop().time()
        while self._checks and self._checks[0] <= now:
            self._checks.pop(0)
        if self._next_sweep is not None and self._next_sweep <= now:
            assert self._verify_interval is not None
            self._next_sweep = now + self._jittered(self._verify_interval)

    async def _woken_or_due(self) -> bool:
        """Wait for a wake-up (True) or, while the node is wanted, a due check (False)."""
        interval = self._verify_in()
        if self._wanted and (self._conflict is not None or self._stale_since):
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
        session = self._session
        # Under the lock: a register, update or deregister in progress may be replacing
        # the node right now, and what it finds decides.
        async with self._lock:
            if not (session.connected and self._wanted and self.registered):
                return
            try:
                stat = await session.exists(self.path)
            except ZkError as exc:
                log.info("verifying %s deferred: %s", self.path, exc)
                return
            if stat is not None and stat.ephemeral_owner == session.session_id:
                return
            owner = "absent" if stat is None else f"owned by session 0x{stat.ephemeral_owner:x}"
            log.warning(
                "%s is %s although no event said so (session 0x%x); registering again",
                self.path,
                owner,
                session.session_id or 0,
            )
            self._metrics.vanished.inc()
            self._owned_session = None
            self._metrics.registered.set(0)
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
                await self._ensure_present()
            else:
                await self._ensure_absent()

    async def _ensure_present(self) -> None:
        session = self._session
        for _ in range(_MAX_ATTEMPTS):
            current_session = session.session_id
            # Create first only when the node is not ours as last seen: a create that
            # fails is still a transaction to ZooKeeper (an error one, proposed to the
            # quorum and written to every member's log like any write), so an update
            # starting with it cost three writes (that create, the set, and the same
            # create again when our own set fired our watch) where one will do. A
            # 50-server fleet marking itself draining took most of a core of the
            # ensemble's CPU for 2 s (make compose-check's drain).
            if not self.registered:
                try:
                    await session.create(self.path, self._data, ephemeral=True, makepath=True)
                except ZkNodeExistsError:
                    pass
                else:
                    self._took_ownership(current_session)
                    await self._watch_node()
                    return
            try:
                data, stat = await session.get(self.path)
            except ZkNoNodeError:
                # Vanished between create and get, or gone since we last saw it (its
                # deletion is what woke us): create it again.
                self._owned_session = None
                self._metrics.registered.set(0)
                continue
            if stat.ephemeral_owner != 0 and stat.ephemeral_owner == current_session:
                if self._owned_session != current_session:
                    # Our create succeeded but its reply was lost to a connection drop.
                    self._took_ownership(current_session)
                if data != self._data:
                    try:
                        await session.set(self.path, self._data, version=stat.version)
                    except (ZkBadVersionError, ZkNoNodeError):
                        continue
                await self._watch_node()
                return
            # Not ours, whatever we last saw: it is replaced below, or waited out.
            self._owned_session = None
            self._metrics.registered.set(0)
            if self._is_stale(data, stat.ephemeral_owner):
                log.warning(
                    "replacing stale %s of our earlier session 0x%x",
                    self.path,
                    stat.ephemeral_owner,
                )
                try:
                    await session.delete(self.path, version=stat.version)
                except (ZkBadVersionError, ZkNoNodeError):
                    pass
                except ZkAuthError as exc:
                    # No right to delete (an access-controlled tree): ZooKeeper removes
                    # the node when its session expires, and our watch brings us back.
                    owner = stat.ephemeral_owner
                    seen_before = owner in self._stale_since
                    first = self._stale_since.setdefault(owner, self._clock())
                    self._metrics.registered.set(0)
                    self._recheck_soon()
                    if (
                        owner not in self._past_sessions
                        and self._clock() - first > self._stale_grace
                    ):
                        # No earlier incarnation's session lives this long: a squatter
                        # that copied our address and port.
                        self._report_conflict(
                            RegistrationConflictError(self.path, owner, impersonated=True)
                        )
                    elif not seen_before:
                        log.warning(
                            "cannot remove stale %s (%s); registering once its session expires",
                            self.path,
                            exc,
                        )
                    await self._watch_node()
                    return
                self._metrics.replaced_stale.inc()
                continue
            self._report_conflict(RegistrationConflictError(self.path, stat.ephemeral_owner))
            self._metrics.registered.set(0)
            await self._watch_node()
            return
        raise ZkError(f"could not register {self.path}: it kept changing under us")

    def _report_conflict(self, conflict: RegistrationConflictError) -> None:
        """Log (at once, then every minute while it lasts), count and expose a conflict."""
        now = self._clock()
        previous = self._conflict
        if previous is None or previous.owner_session != conflict.owner_session:
            log.error("not registered: %s", conflict)
            self._metrics.conflicts.inc()
            self._conflict_since = self._last_reminder = now
        elif now - self._last_reminder >= _CONFLICT_REMINDER:
            log.error("still not registered after %.0f s: %s", now - self._conflict_since, conflict)
            self._last_reminder = now
        self._conflict = conflict
        self._metrics.conflicted.set(1)
        self._recheck_soon()

    def _clear_conflict(self) -> None:
        if self._conflict is not None:
            log.info("%s: the conflicting node is gone", self.path)
        self._conflict = None
        self._stale_since.clear()
        self._metrics.conflicted.set(0)

    def _took_ownership(self, session_id: int | None) -> None:
        recreated = self._ever_registered
        self._owned_session = session_id
        self._clear_conflict()
        self._metrics.creates.inc()
        if recreated:
            self._metrics.recreates.inc()
            log.info("re-registered %s in session 0x%x", self.path, session_id or 0)
        else:
            log.info("registered %s in session 0x%x", self.path, session_id or 0)
        self._ever_registered = True
        self._metrics.registered.set(1)

    def _is_stale(self, data: bytes, owner: int) -> bool:
        if owner == 0:
            return False  # a persistent node is an operator's, not a stale session's
        if owner in self._past_sessions:
            return True
        try:
            existing = ServiceInstance.from_json(data)
        except InvalidInstanceError:
            return False
        return (existing.address, existing.port) == (self._instance.address, self._instance.port)

    async def _watch_node(self) -> None:
        await self._session.exists(self.path, watch=self._on_node_event)

    async def _ensure_absent(self) -> None:
        # Checked on the server even if we think we own nothing: a create whose reply
        # was lost to a connection drop may have left our node behind.
        try:
            _, stat = await self._session.get(self.path)
        except ZkNoNodeError:
            pass
        else:
            if stat.ephemeral_owner == self._session.session_id:
                await self._remove(stat.version)
        self._owned_session = None
        self._metrics.registered.set(0)
        # Not wanted: no longer anybody's conflict.
        self._conflict = None
        self._stale_since.clear()
        self._metrics.conflicted.set(0)

    async def _remove(self, version: int) -> None:
        if not self._delete_refused:
            try:
                await self._session.delete(self.path, version=version)
            except (ZkNoNodeError, ZkBadVersionError):
                pass
            except ZkAuthError:
                if self._removal is Removal.DELETE:
                    raise
                log.info(
                    "the ACL refuses deleting %s; removing it by ending the session", self.path
                )
                self._delete_refused = True
            else:
                log.info("deregistered %s", self.path)
                return
        if self._session_closing:
            return  # the caller's close ends the session, and the node with it
        # Our node is what the old session takes with it; the registration task, woken
        # by the new session, finds nothing to re-create since we no longer want it.
        await self._session.restart()
        log.info("deregistered %s by ending its session", self.path)
