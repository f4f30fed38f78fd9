"""Every public error of the discovery framework, under :class:`DiscoveryError`.

kazoo's and redis-py's errors are translated where they enter our code, keeping the
original as ``__cause__``::

    DiscoveryError
    ├── ConfigError (ValueError)            a setting is missing or malformed
    ├── InvalidInstanceError (ValueError)   a ServiceInstance document is malformed
    │   └── PayloadTooLargeError
    ├── InvalidMarkerError (ValueError)     a maintenance marker that cannot be written
    ├── BadRequestError (ValueError)        an HTTP client's input (answered 400)
    ├── ProbeFailed                         a health probe's verdict: not healthy
    ├── ZkError                             a ZooKeeper operation failed
    │   ├── ZkConnectionError               connection down or timed out (retry later)
    │   │   └── ZkSessionExpiredError       the session and its ephemeral nodes are gone
    │   ├── ZkAuthError, ZkNoNodeError, ZkNodeExistsError, ZkBadVersionError
    │   ├── ZkUnsupportedError              the server lacks a request (addWatch: < 3.6)
    │   └── RegistrationConflictError       another live session owns our id
    ├── FencedError                         a newer leader has published: stop leading
    ├── StoreError                          the live-list store failed (retry later)
    │   ├── StoreUnavailableError           the store unreachable, loading or read-only
    │   │   └── RedisUnavailableError       (also a RedisOperationError)
    │   └── RedisOperationError             an error reply from Redis
    ├── StoreAccessError                    credentials or ACL refused (retrying won't help)
    │   └── RedisAccessError
    │       ├── RedisAuthError
    │       └── RedisPermissionError
    ├── MalformedLiveListError              a stored list or change that cannot be used
    │   └── MalformedMetaError              the list's meta record (Redis P:meta)
    ├── OverloadedError                     the fan-out refused a query (answer 503)
    ├── DevClusterError                     a local ZooKeeper/Redis (discovery.testing)
    └── StatusError                         `discovery status` could not read a system
"""

from __future__ import annotations

__all__ = [
    "BadRequestError",
    "ConfigError",
    "DevClusterError",
    "DiscoveryError",
    "FencedError",
    "InvalidInstanceError",
    "InvalidMarkerError",
    "KazooIncompatibleError",
    "MalformedLiveListError",
    "MalformedMetaError",
    "OverloadedError",
    "PayloadTooLargeError",
    "ProbeFailed",
    "RedisAccessError",
    "RedisAuthError",
    "RedisOperationError",
    "RedisPermissionError",
    "RedisUnavailableError",
    "RegistrationConflictError",
    "StatusError",
    "StoreAccessError",
    "StoreError",
    "StoreUnavailableError",
    "ZkAuthError",
    "ZkBadVersionError",
    "ZkConnectionError",
    "ZkError",
    "ZkNoNodeError",
    "ZkNodeExistsError",
    "ZkSessionExpiredError",
    "ZkUnsupportedError",
]


class DiscoveryError(Exception):
    """Root of every error raised by the discovery framework."""


class ConfigError(DiscoveryError, ValueError):
    """A setting is missing or malformed; the message names the flag or variable."""


class InvalidInstanceError(DiscoveryError, ValueError):
    """A ServiceInstance document is malformed (bad JSON, missing field, wrong type)."""


class PayloadTooLargeError(InvalidInstanceError):
    """A ServiceInstance document exceeds the size bound (64 KiB by default)."""


class InvalidMarkerError(DiscoveryError, ValueError):
    """A maintenance marker (``/maintenance/<id>``) to write is unusable: a bad instance
    id, a blank or over-long reason. Markers *read* are never refused this way: an
    unreadable one still puts its server in maintenance (:mod:`discovery.zk.maintenance`)."""


class BadRequestError(DiscoveryError, ValueError):
    """A client's input is unusable; answered 400 with a message naming ``parameter``.

    ``reason`` is a short fixed token (``missing``, ``blank``, ``too_long``,
    ``not_integer``, ``not_number``, ``out_of_range``, ``invalid_json``, ``too_deep``,
    ``invalid``, ...) used as a metric label, so it must never contain client input.
    """

    def __init__(self, parameter: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.reason = reason


class ProbeFailed(DiscoveryError):
    """A probe's verdict: the server is not healthy, for the reason given.

    Any exception from a probe counts as a failure; this one says so on purpose, and its
    message becomes the reason the agent reports and logs.
    """


class ZkError(DiscoveryError):
    """A ZooKeeper operation failed."""


class ZkConnectionError(ZkError):
    """The connection to ZooKeeper is down or an operation timed out.

    The session may still be alive: callers should wait for the next CONNECTED
    state and retry, not assume their ephemeral nodes are gone.
    """


class ZkSessionExpiredError(ZkConnectionError):
    """The ZooKeeper session expired: its ephemeral nodes and watches are gone."""


class ZkAuthError(ZkError):
    """Authentication failed or the ACL does not allow the operation."""


class ZkNoNodeError(ZkError):
    """The znode does not exist."""


class ZkNodeExistsError(ZkError):
    """The znode already exists."""


class ZkBadVersionError(ZkError):
    """A conditional update or delete lost a race: the znode's version changed."""


class ZkUnsupportedError(ZkError):
    """The ZooKeeper server does not implement a request we need (it answered
    UNIMPLEMENTED): ``addWatch`` needs ZooKeeper 3.6 or later."""


class RegistrationConflictError(ZkError):
    """Another live session owns the znode of our instance id; we refuse to steal it."""

    def __init__(self, path: str, owner_session: int, *, impersonated: bool = False) -> None:
        if impersonated:
            why = (
                "its document names our own address and port, yet its session has outlived "
                "any earlier incarnation of ours: another identity is squatting our id"
            )
        else:
            why = (
                "is another server configured with the same --id, or is another identity "
                "squatting it? (see docs/ARCHITECTURE.md, 'Choosing instance ids')"
            )
        super().__init__(
            f"{path} is owned by another live ZooKeeper session 0x{owner_session:x}; {why}"
        )
        self.path = path
        self.owner_session = owner_session
        self.impersonated = impersonated


class KazooIncompatibleError(DiscoveryError, ImportError):
    """The installed kazoo lacks an internal that :mod:`discovery.zk` relies on (raised
    when :mod:`discovery.zk` is imported; the message names the kazoo version)."""


class DevClusterError(DiscoveryError):
    """A local ZooKeeper or Redis process could not be started or did not answer, or a
    fault could not be injected (:mod:`discovery.testing`; never raised by the library)."""


class StatusError(DiscoveryError):
    """``discovery status``: ZooKeeper or Redis could not be reached or read; one line per
    failure. ``refused`` is true when one of them answered but refused (credentials or
    ACL), which retrying cannot fix."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class FencedError(DiscoveryError):
    """A live-list publish or heartbeat was refused: Redis holds a newer epoch or version.

    Another leader (a newer epoch) or another writer in our epoch has published. The
    publisher has been deposed and must stop leading; retrying cannot succeed. (Unless
    ``stored_epoch`` is one no leader can hold, which the leader checks against
    ZooKeeper, :mod:`discovery.zk.epochs`: then the fence is poisoned, not taken over.)
    ``reason`` is ``"epoch"`` or ``"version"``; ``stored_epoch`` and ``stored_version``
    are what Redis holds.
    """

    def __init__(
        self,
        *,
        epoch: int,
        version: int,
        stored_epoch: int,
        stored_version: int,
        reason: str,
    ) -> None:
        super().__init__(
            f"publish of epoch {epoch} version {version} refused ({reason} fence): Redis holds "
            f"epoch {stored_epoch} version {stored_version}; another leader has taken over"
        )
        self.epoch = epoch
        self.version = version
        self.stored_epoch = stored_epoch
        self.stored_version = stored_version
        self.reason = reason


class StoreError(DiscoveryError):
    """The live-list store (:class:`~discovery.livelist.LiveListStore`) failed for now.

    Transient by nature: a publisher's caller keeps its view and publishes in full later,
    a follower keeps its last list. A write that failed this way may have been applied.
    Each backend raises a subclass of its own (:class:`RedisOperationError`).
    """


class StoreUnavailableError(StoreError):
    """The store cannot be reached or cannot serve right now (connection refused or lost,
    a timeout, a failover in progress, an outage the in-memory store simulates).

    The outcome of a write that failed this way is unknown: it may have been applied.
    """


class RedisOperationError(StoreError):
    """A Redis command failed with an error reply or an unexpected answer.

    redis-py errors are translated where they enter our code
    (:func:`discovery.livelist.redis.layout.translate_redis_error`); the original is ``__cause__``.
    """


class RedisUnavailableError(RedisOperationError, StoreUnavailableError):
    """Redis cannot be reached or cannot serve writes right now (connection refused or lost,
    timeout, loading its data, read-only replica).

    The outcome of a write that failed this way is unknown: it may have been applied.
    """


class StoreAccessError(DiscoveryError):
    """The store refused us: bad credentials, or an ACL that does not allow what we asked.

    Deliberately *not* a :class:`StoreError`: callers retry those (an outage passes),
    but waiting does not fix a wrong password or a missing permission. An operator has
    to change the configuration or the store's ACL, so whoever meets this error should
    stop what needs the permission and say so loudly.
    """


class RedisAccessError(StoreAccessError):
    """Redis refused us: bad credentials, or an ACL that does not allow what we asked.

    Translated from redis-py by
    :func:`discovery.livelist.redis.layout.translate_redis_error`; the original is
    ``__cause__``.
    """


class RedisAuthError(RedisAccessError):
    """Authentication failed: wrong or missing password, unknown or disabled user."""


class RedisPermissionError(RedisAccessError):
    """Authenticated, but the user's ACL refuses a command, key or channel (NOPERM)."""


class MalformedLiveListError(DiscoveryError):
    """A stored live list or change we cannot use; ``position`` is its ``(epoch, version)``
    if those were readable. Readers skip it and count it; it never stops them."""

    def __init__(self, message: str, position: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.position = position


class MalformedMetaError(MalformedLiveListError):
    """The record that says which list is stored (Redis ``P:meta``) cannot be used: a
    field missing, or a number out of the layout's bounds.

    ``stream_id`` is the change stream's last id read in the same transaction: a reader
    follows from there, so that only what is published after it makes it load again.
    """

    def __init__(
        self, message: str, position: tuple[int, int] | None = None, stream_id: str = "0-0"
    ) -> None:
        super().__init__(message, position)
        self.stream_id = stream_id


class OverloadedError(DiscoveryError):
    """Admission control refused a query: ``max_in_flight`` queries are already running.

    The HTTP handler answers 503 at once, so that clients and load balancers back off or
    go to another search server instead of queueing behind a slow cluster.
    """
