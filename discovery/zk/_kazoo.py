"""Every use of kazoo's private internals, in one place, checked when imported.

A kazoo that lacks one fails ``import discovery`` with an error naming its version and
the missing names (:func:`check`), never a watch that silently never fires.

Design: docs/design/zookeeper.md, "The persistent watch and kazoo".
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final

from kazoo.client import KazooClient
from kazoo.protocol import paths as _paths
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.states import KazooState

from discovery.errors import KazooIncompatibleError

__all__ = [
    "TESTED",
    "check",
    "client_state",
    "connection",
    "has_one_shot_watch",
    "in_flight_requests",
    "is_stopped",
    "oldest_pending_request",
    "pop_child_watchers",
    "prefix_root",
    "requested_session_timeout",
    "restore_readers",
    "shadow_readers",
    "submit",
    "wait_live",
]

#: The kazoo releases these internals were read from and are tested with.
TESTED: Final = ">=2.10,<2.12"

#: Methods looked up on kazoo's classes.
_CLASS_ATTRIBUTES: Final = (
    (KazooClient, "_call"),
    (ConnectionHandler, "_read_watch_event"),
    (ConnectionHandler, "_read_response"),
    (_paths, "_prefix_root"),
)
#: Attributes a client sets in its constructor.
_CLIENT_ATTRIBUTES: Final = (
    "_connection",
    "_session_timeout",
    "_data_watchers",
    "_child_watchers",
    "_pending",
    "_queue",
    "_stopped",
    "_live",
    "_state",
)
_READERS: Final = ("_read_watch_event", "_read_response")


def _kazoo_version() -> str:
    try:
        return version("kazoo")
    except PackageNotFoundError:  # a kazoo imported from a source tree
        return "unknown"


def check(client: KazooClient | None = None) -> None:
    """Verify that kazoo has every private name this module uses.

    ``client`` is any unstarted client (one is made, never started, by default: kazoo's
    constructor opens no socket and starts no thread).

    Raises:
        KazooIncompatibleError: a name is missing; the message names the kazoo version,
            the missing names and :data:`TESTED`.
    """
    missing = [
        f"{getattr(owner, '__name__', owner)}.{name}"
        for owner, name in _CLASS_ATTRIBUTES
        if not hasattr(owner, name)
    ]
    probe = client if client is not None else KazooClient(hosts="127.0.0.1:2181")
    missing += [f"KazooClient().{name}" for name in _CLIENT_ATTRIBUTES if not hasattr(probe, name)]
    connection_ = getattr(probe, "_connection", None)
    if connection_ is not None:
        missing += [
            f"KazooClient()._connection.{name}"
            for name in _READERS
            if not callable(getattr(connection_, name, None))
        ]
    if missing:
        raise KazooIncompatibleError(
            f"kazoo {_kazoo_version()} lacks {', '.join(missing)}, which discovery uses "
            f"(kazoo {TESTED} is tested): install a kazoo in that range"
        )


# -- sending our own requests -------------------------------------------------------


def submit(client: KazooClient, request: Any, result: Any) -> None:
    """Queue ``request`` (anything with ``type`` and ``serialize()``) on ``client``'s
    connection, the way kazoo's ``*_async`` methods do; ``result`` (from
    ``client.handler.async_result()``) receives the answer or the error."""
    client._call(request, result)


def prefix_root(chroot: str, path: str) -> str:
    """``path`` under ``chroot``, exactly as kazoo chroots its own requests."""
    prefixed: str = _paths._prefix_root(chroot, path)
    return prefixed


def requested_session_timeout(client: KazooClient) -> float:
    """The session timeout ``client`` asks the server for, in seconds."""
    return float(client._session_timeout) / 1000.0


# -- the connection's readers ---------------------------------------------------------


def connection(client: KazooClient) -> Any:
    """``client``'s connection handler (one per client, for the client's lifetime)."""
    return client._connection


def shadow_readers(
    connection_: Any,
    on_watch_event: Callable[[bytes, int], None],
    on_response: Callable[[Any, bytes, int], Any],
) -> tuple[Callable[[bytes, int], None], Callable[[Any, bytes, int], Any]]:
    """Make the connection thread call ``on_watch_event`` and ``on_response`` for every
    watch event and response it reads; returns kazoo's own readers, which the
    replacements must call (they run on the connection thread)."""
    originals = (connection_._read_watch_event, connection_._read_response)
    connection_._read_watch_event = on_watch_event
    connection_._read_response = on_response
    return originals


def restore_readers(
    connection_: Any,
    on_watch_event: Callable[[bytes, int], None],
    on_response: Callable[[Any, bytes, int], Any],
) -> bool:
    """Undo :func:`shadow_readers` if nobody shadowed the readers after us; True if
    undone. Otherwise ours stay in the chain (the caller makes them pass through)."""
    own = connection_.__dict__
    if own.get(_READERS[0]) != on_watch_event or own.get(_READERS[1]) != on_response:
        return False
    for name in _READERS:
        delattr(connection_, name)
    return True


# -- the client's bookkeeping ---------------------------------------------------------


def is_stopped(client: KazooClient) -> bool:
    """True once ``client.stop()`` has begun."""
    return bool(client._stopped.is_set())


def wait_live(client: KazooClient, timeout: float) -> bool:
    """Block until ``client`` is connected (True) or ``timeout`` passes (False)."""
    return bool(client._live.wait(timeout))


def client_state(client: KazooClient) -> KazooState:
    """The ZooKeeper keeper state kazoo puts in the watch events it makes."""
    state: KazooState = client._state
    return state


def pop_child_watchers(client: KazooClient, path: str) -> list[Callable[..., Any]]:
    """Take ``client``'s one-shot child watchers of the server path ``path``."""
    watchers: list[Callable[..., Any]] = list(client._child_watchers.pop(path, None) or ())
    return watchers


def has_one_shot_watch(client: KazooClient, path: str) -> bool:
    """True if ``client`` holds a one-shot data or child watcher for server ``path``."""
    return bool(client._data_watchers.get(path) or client._child_watchers.get(path))


def in_flight_requests(client: KazooClient) -> list[Any]:
    """The requests ``client`` has sent or queued and not had answered yet (a copy)."""
    return [entry[0] for entry in list(client._pending) + list(client._queue)]


def oldest_pending_request(client: KazooClient) -> Any | None:
    """The request the next response on the wire answers, if any (connection thread)."""
    try:
        return client._pending[0][0]
    except IndexError:
        return None


check()
