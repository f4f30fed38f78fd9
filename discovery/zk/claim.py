"""Creating and keeping the ephemeral node of a :class:`~discovery.zk.registration.Registration`.

A stale node of ours is replaced; one a live foreign session owns is never taken (a
conflict). ZooKeeper errors are raised, except the races :class:`NodeClaim` resolves.

Design: docs/design/zookeeper.md, "Registration".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from discovery.errors import (
    InvalidInstanceError,
    RegistrationConflictError,
    ZkAuthError,
    ZkBadVersionError,
    ZkError,
    ZkNodeExistsError,
    ZkNoNodeError,
)
from discovery.instance import ServiceInstance
from discovery.metrics import RegistrationMetrics
from discovery.zk.conflict import ConflictTracker
from discovery.zk.session import WatchEvent, ZkSession

__all__ = ["NodeClaim"]

log = logging.getLogger(__name__)

# Create/replace races (a stale node deleted under us, a node vanishing between
# NodeExists and our read) resolve in a step or two; more means something is
# fighting us, which is reported rather than looped on.
_MAX_ATTEMPTS: Final = 5


class NodeClaim:
    """The node ``path`` of ``instance`` in ``session``, as far as we own it.

    Every call that talks to ZooKeeper must be serialised with the others (the
    registration's lock). After each create or read the node is watched with
    ``on_node_event``, so that its deletion or change by anyone else is noticed.
    """

    def __init__(
        self,
        session: ZkSession,
        path: str,
        instance: ServiceInstance,
        metrics: RegistrationMetrics,
        conflicts: ConflictTracker,
        *,
        on_node_event: Callable[[WatchEvent], None],
    ) -> None:
        self._session = session
        self._path = path
        self._instance = instance
        self._data = instance.to_json()
        self._metrics = metrics
        self._conflicts = conflicts
        self._on_node_event = on_node_event
        self._owned_session: int | None = None
        self._past_sessions: set[int] = set()
        self._ever_registered = False

    @property
    def instance(self) -> ServiceInstance:
        """The instance the node is to hold."""
        return self._instance

    @instance.setter
    def instance(self, instance: ServiceInstance) -> None:
        # Written to ZooKeeper by the next ensure_present().
        self._instance = instance
        self._data = instance.to_json()

    @property
    def registered(self) -> bool:
        """True while our node exists and belongs to the current session (as last seen)."""
        return self._owned_session is not None and self._owned_session == self._session.session_id

    def on_new_session(self) -> None:
        """A new session is connected: the old one's node died with it."""
        if self._owned_session is not None:
            self._past_sessions.add(self._owned_session)
            self._owned_session = None
            self._metrics.registered.set(0)

    def on_session_lost(self) -> None:
        """The session is lost: the node went with it (or goes soon, if the session was
        only declared lost on our side: see ZkSession's watchdog)."""
        if self._owned_session is not None:
            self._past_sessions.add(self._owned_session)
            self._owned_session = None
        self._metrics.registered.set(0)

    def released(self) -> None:
        """The node was removed (or was not ours): we own nothing."""
        self._owned_session = None
        self._metrics.registered.set(0)

    async def ensure_present(self) -> None:
        """Create our node, or make the one there ours and current, or report why not.

        Raises:
            ZkError: ZooKeeper failed, or the node kept changing under us.
        """
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
                    await session.create(self._path, self._data, ephemeral=True, makepath=True)
                except ZkNodeExistsError:
                    pass
                else:
                    self._took_ownership(current_session)
                    await self._watch_node()
                    return
            try:
                data, stat = await session.get(self._path)
            except ZkNoNodeError:
                # Vanished between create and get, or gone since we last saw it (its
                # deletion is what woke us): create it again.
                self.released()
                continue
            if stat.ephemeral_owner != 0 and stat.ephemeral_owner == current_session:
                if self._owned_session != current_session:
                    # Our create succeeded but its reply was lost to a connection drop.
                    self._took_ownership(current_session)
                if data != self._data:
                    try:
                        await session.set(self._path, self._data, version=stat.version)
                    except (ZkBadVersionError, ZkNoNodeError):
                        continue
                await self._watch_node()
                return
            # Not ours, whatever we last saw: it is replaced below, or waited out.
            self.released()
            if self._is_stale(data, stat.ephemeral_owner):
                log.warning(
                    "replacing stale %s of our earlier session 0x%x",
                    self._path,
                    stat.ephemeral_owner,
                )
                try:
                    await session.delete(self._path, version=stat.version)
                except (ZkBadVersionError, ZkNoNodeError):
                    pass
                except ZkAuthError as exc:
                    # No right to delete (an access-controlled tree): ZooKeeper removes
                    # the node when its session expires, and our watch brings us back.
                    owner = stat.ephemeral_owner
                    self._metrics.registered.set(0)
                    if self._conflicts.undeletable(
                        owner, past_session=owner in self._past_sessions
                    ):
                        log.warning(
                            "cannot remove stale %s (%s); registering once its session expires",
                            self._path,
                            exc,
                        )
                    await self._watch_node()
                    return
                self._metrics.replaced_stale.inc()
                continue
            self._conflicts.report(RegistrationConflictError(self._path, stat.ephemeral_owner))
            self._metrics.registered.set(0)
            await self._watch_node()
            return
        raise ZkError(f"could not register {self._path}: it kept changing under us")

    async def verify(self) -> bool:
        """Read our node back; True if it is gone or no longer ours (counted, logged).

        Call only while :attr:`registered`. A ZooKeeper error defers the check
        (logged; False).
        """
        session = self._session
        try:
            stat = await session.exists(self._path)
        except ZkError as exc:
            log.info("verifying %s deferred: %s", self._path, exc)
            return False
        if stat is not None and stat.ephemeral_owner == session.session_id:
            return False
        owner = "absent" if stat is None else f"owned by session 0x{stat.ephemeral_owner:x}"
        log.warning(
            "%s is %s although no event said so (session 0x%x); registering again",
            self._path,
            owner,
            session.session_id or 0,
        )
        self._metrics.vanished.inc()
        self.released()
        return True

    def _took_ownership(self, session_id: int | None) -> None:
        recreated = self._ever_registered
        self._owned_session = session_id
        self._conflicts.clear()
        self._metrics.creates.inc()
        if recreated:
            self._metrics.recreates.inc()
            log.info("re-registered %s in session 0x%x", self._path, session_id or 0)
        else:
            log.info("registered %s in session 0x%x", self._path, session_id or 0)
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
        await self._session.exists(self._path, watch=self._on_node_event)
