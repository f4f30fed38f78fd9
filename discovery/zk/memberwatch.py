"""The watches that tell a membership watcher what to read again (:class:`MembershipWatches`).

One persistent recursive watch on the directory (ZooKeeper 3.6+ ``addWatch``) names each
child created, changed or deleted; without it, a child watch on the directory and a data
watch per child do, and a child event means re-listing the names. The callbacks only
mark what is dirty and set :attr:`MembershipWatches.wake`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from discovery.errors import ZkUnsupportedError
from discovery.zk.session import SessionEvent, SessionState, WatchEvent, ZkSession
from discovery.zk.watch import SessionRecursiveWatch

__all__ = ["MembershipWatches"]

log = logging.getLogger(__name__)


class MembershipWatches:
    """The watches on ``path`` and the marks they leave for the next refresh.

    With ``persistent`` the recursive watch is tried first; on a server without
    ``addWatch``, or once that watch fails, it falls back to child and data watches
    for good (:attr:`persistent` turns False). The marks start as "read everything";
    every reconnect (with the persistent watch: its ``resync`` once it is back on the
    server) marks everything again, since watches may have been lost with the session.
    """

    def __init__(self, session: ZkSession, path: str, *, persistent: bool = True) -> None:
        self._session = session
        self._path = path
        self._persistent = persistent
        self._recursive: SessionRecursiveWatch | None = None
        self._full = True
        self._children_dirty = True
        self._dirty_nodes: set[str] = set()
        #: Set when something is marked; the refresh task waits for it and clears it.
        self.wake = asyncio.Event()

    @property
    def persistent(self) -> bool:
        """True while following with a persistent recursive watch (else re-listing)."""
        return self._persistent

    @property
    def children_watch(self) -> Callable[[WatchEvent], None] | None:
        """The child watch to set when listing the directory (None with the persistent one)."""
        return None if self._persistent else self._on_children_event

    @property
    def node_watch(self) -> Callable[[WatchEvent], None] | None:
        """The data watch to set when reading a child (None with the persistent one)."""
        return None if self._persistent else self._on_node_event

    def listen(self) -> None:
        """Follow the session's state (on the loop): a reconnect marks everything."""
        self._session.add_listener(self._on_session_event)

    async def start(self) -> None:
        """Add the persistent recursive watch if asked for; fall back if unsupported.

        Raises:
            ZkError: adding the watch failed for another reason.
        """
        if not self._persistent:
            return
        watch = SessionRecursiveWatch(self._session, self._path, self._on_recursive_event)
        try:
            await watch.start()
        except ZkUnsupportedError as exc:
            log.warning(
                "%s: the ZooKeeper server has no persistent watches (%s); re-listing the "
                "children on every change instead",
                self._path,
                exc,
            )
            self._persistent = False
            return
        self._recursive = watch

    async def aclose(self) -> None:
        """Stop following the session and remove the persistent watch. Idempotent."""
        self._session.remove_listener(self._on_session_event)
        watch, self._recursive = self._recursive, None
        if watch is not None:
            await watch.aclose()

    def take(self) -> tuple[bool, bool, set[str]]:
        """The marks, cleared: (read everything, re-list the names, children to read)."""
        full, relist, dirty = self._full, self._children_dirty or self._full, self._dirty_nodes
        self._full, self._children_dirty, self._dirty_nodes = False, False, set()
        return full, relist, dirty

    def mark_full(self) -> None:
        """Read everything next time (a refresh failed: none of it was applied)."""
        self._full = True

    # -- callbacks (on the loop) ------------------------------------------------

    def _on_session_event(self, event: SessionEvent) -> None:
        # With the persistent watch, its resync event (once it is back on the server)
        # asks for the re-read instead: a read before it could miss a change.
        if event.state is SessionState.CONNECTED and not self._persistent:
            # Re-read everything: after an expiry our watches are gone, and after a
            # long disconnect a full read is the simplest proof of being current.
            self._full = True
            self.wake.set()

    def _on_recursive_event(self, event: WatchEvent) -> None:
        if event.kind == "resync":
            self._full = True
        elif event.kind == "failed":
            log.warning("%s: the persistent watch failed; re-listing the children", self._path)
            self._persistent = False
            self._full = True
        elif event.path.rsplit("/", 1)[0] == self._path:
            # A child created, changed or deleted: read it (a deleted one reads as gone).
            self._dirty_nodes.add(event.path.rsplit("/", 1)[-1])
        elif event.path == self._path:
            self._full = True  # the directory itself was deleted or created
        else:
            return  # deeper nodes are not members
        self.wake.set()

    def _on_children_event(self, event: WatchEvent) -> None:
        self._children_dirty = True
        self.wake.set()

    def _on_node_event(self, event: WatchEvent) -> None:
        child = event.path.rsplit("/", 1)[-1]
        if event.kind in ("changed", "deleted", "created"):
            self._dirty_nodes.add(child)
            self.wake.set()
