"""How a :class:`~discovery.zk.registration.Registration` removes its node.

Delete it, or end the session that owns it; only ever a node of the current session.
ZooKeeper errors are raised, except a node already gone.

Design: docs/design/zookeeper.md, "Registration".
"""

from __future__ import annotations

import enum
import logging

from discovery.errors import ZkAuthError, ZkBadVersionError, ZkNoNodeError
from discovery.zk.session import ZkSession

__all__ = ["NodeRemover", "Removal"]

log = logging.getLogger(__name__)


class Removal(enum.Enum):
    """How a :class:`~discovery.zk.registration.Registration` removes its node when
    deregistering."""

    #: Delete the node (needs DELETE on its parent).
    DELETE = "delete"
    #: End the session (ZooKeeper removes its ephemeral nodes with no ACL check) and
    #: open a new one. Only for a session that nothing but this registration uses.
    END_SESSION = "end_session"
    #: Delete; once the parent's ACL refuses that, end the session from then on.
    #: Only for a session that nothing but this registration uses.
    AUTO = "auto"


class NodeRemover:
    """Remove ``path`` from ``session`` as ``removal`` says.

    Set :attr:`session_closing` when the caller closes the session right afterwards:
    a removal by ending the session then leaves that to the close instead of opening
    a new session first. Set :attr:`session_final` when nothing will use the session
    after this removal (a drain, before the stop): a removal by ending the session then
    closes it for good, the node with it, instead of opening a new session for nothing
    (a TLS handshake and a session on ZooKeeper each, times a fleet draining at once).
    """

    def __init__(self, session: ZkSession, path: str, removal: Removal) -> None:
        self._session = session
        self._path = path
        self._removal = removal
        # Removing ends the session: always under END_SESSION, and under AUTO once the
        # ACL has refused a delete (it will go on refusing).
        self._delete_refused = removal is Removal.END_SESSION
        self.session_closing = False
        self.session_final = False

    async def remove_if_ours(self) -> None:
        """Remove the node if the current session owns it.

        Raises:
            ZkConnectionError: not connected (or the new session is not up yet after
                ending the old one; the old node is gone all the same).
            ZkAuthError: under ``Removal.DELETE``, the ACL refuses the delete.
        """
        # Checked on the server even if we think we own nothing: a create whose reply
        # was lost to a connection drop may have left our node behind.
        try:
            _, stat = await self._session.get(self._path)
        except ZkNoNodeError:
            return
        if stat.ephemeral_owner == self._session.session_id:
            await self._remove(stat.version)

    async def _remove(self, version: int) -> None:
        if not self._delete_refused:
            try:
                await self._session.delete(self._path, version=version)
            except (ZkNoNodeError, ZkBadVersionError):
                pass
            except ZkAuthError:
                if self._removal is Removal.DELETE:
                    raise
                log.info(
                    "the ACL refuses deleting %s; removing it by ending the session", self._path
                )
                self._delete_refused = True
            else:
                log.info("deregistered %s", self._path)
                return
        if self.session_closing:
            return  # the caller's close ends the session, and the node with it
        if self.session_final:
            # Closing sends closeSession: ZooKeeper removes the node before it answers.
            await self._session.aclose()
            log.info("deregistered %s by closing its session", self._path)
            return
        # Our node is what the old session takes with it; the registration task, woken
        # by the new session, finds nothing to re-create since we no longer want it.
        await self._session.restart()
        log.info("deregistered %s by ending its session", self._path)
