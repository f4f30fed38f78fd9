"""A Redis Sentinel group as its sentinels and data servers report it, and the waits on it.

:class:`SentinelView` reads the group over the wire (``SENTINEL ...``, ``INFO
replication``) and polls conditions on it with a deadline. A process that does not
answer reads as nothing (None, empty, False); a wait that times out, or sees a watched
process exit, raises ``DevClusterError`` with the tails of every process's log.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from discovery.errors import DevClusterError

from .process import ManagedProcess, log_tails
from .redis import RedisServer, redis_query
from .sentinelprocess import Address, RedisSentinel

__all__ = ["SentinelView", "address_of"]

_POLL_INTERVAL_S = 0.05
# Each process's log tail in a group's error message: enough to see why, for five or more.
_TAIL_LINES = 12


def address_of(server: RedisServer) -> Address:
    """``(host, port)`` of ``server``."""
    return (server.host, server.port)


def _query(address: Address, *command: str, password: str | None = None) -> Any:
    return redis_query(*address, *command, password=password)


def _fields(reply: Any) -> dict[str, str]:
    """A flat ``[key, value, key, value, ...]`` reply (``SENTINEL MASTER``) as a dict."""
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    if not isinstance(reply, list):
        return {}
    return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


class SentinelView:
    """What ``sentinels`` report of ``master_name`` and ``servers`` of their replication.

    ``servers`` and ``sentinels`` are the group's (the first server is the first
    primary); ``password`` is the data servers' ``default`` user's, None without one.
    """

    def __init__(
        self,
        servers: Sequence[RedisServer],
        sentinels: Sequence[RedisSentinel],
        master_name: str,
        password: str | None,
    ) -> None:
        self._servers = servers
        self._sentinels = sentinels
        self._master_name = master_name
        self._password = password

    # -- one process's report ----------------------------------------------------------

    def info(self, address: Address) -> dict[str, str]:
        """``INFO replication`` of a data server as a dict; empty if it does not answer."""
        reply = _query(address, "INFO", "replication", password=self._password)
        if not isinstance(reply, dict):
            return {}
        return {str(k): str(v) for k, v in reply.items()}

    def master(self, sentinel: RedisSentinel) -> dict[str, str]:
        """``SENTINEL MASTER`` of ``sentinel`` as a dict (empty if it does not answer)."""
        return _fields(
            _query((sentinel.host, sentinel.port), "SENTINEL", "MASTER", self._master_name)
        )

    def primary_of(self, sentinel: RedisSentinel) -> Address | None:
        """The primary's address as ``sentinel`` reports it; None if it cannot tell."""
        reply = _query(
            (sentinel.host, sentinel.port),
            "SENTINEL",
            "GET-MASTER-ADDR-BY-NAME",
            self._master_name,
        )
        if not isinstance(reply, list | tuple) or len(reply) != 2:
            return None
        try:
            return (str(reply[0]), int(reply[1]))
        except ValueError:
            return None

    def replicas_of(self, sentinel: RedisSentinel) -> list[dict[str, str]]:
        """``SENTINEL REPLICAS`` of ``sentinel``, one dict per replica."""
        reply = _query((sentinel.host, sentinel.port), "SENTINEL", "REPLICAS", self._master_name)
        return [_fields(entry) for entry in reply] if isinstance(reply, list) else []

    def sees_replica(self, sentinel: RedisSentinel, address: Address) -> bool:
        """True if ``sentinel`` knows the server at ``address`` as a replica that is up."""
        for fields in self.replicas_of(sentinel):
            if (fields.get("ip"), fields.get("port")) == (address[0], str(address[1])):
                return fields.get("flags") == "slave"
        return False

    def replicates_from(self, server: RedisServer, primary: Address) -> bool:
        """True if ``server`` is a replica linked (``master_link_status:up``) to ``primary``."""
        info = self.info(address_of(server))
        return (
            info.get("role") == "slave"
            and info.get("master_link_status") == "up"
            and (info.get("master_host"), info.get("master_port")) == (primary[0], str(primary[1]))
        )

    # -- the group's ----------------------------------------------------------------

    def primary_address(self) -> Address:
        """The primary's address as the first answering sentinel reports it.

        Raises:
            DevClusterError: no sentinel answers with an address.
        """
        for sentinel in self._sentinels:
            address = self.primary_of(sentinel)
            if address is not None:
                return address
        raise DevClusterError(f"no sentinel knows the address of {self._master_name!r}")

    def server_at(self, address: Address) -> RedisServer:
        """The data server at ``address``.

        Raises:
            DevClusterError: none of the group's is there.
        """
        for server in self._servers:
            if address_of(server) == address:
                return server
        raise DevClusterError(f"the sentinels report {address[0]}:{address[1]}, not ours")

    def replicas_linked(self) -> bool:
        """True if every server after the first replicates from the first."""
        first = address_of(self._servers[0])
        return all(self.replicates_from(s, first) for s in self._servers[1:])

    def sentinels_converged(self) -> bool:
        """True if every sentinel knows the first server as the primary (not down), every
        replica as fit to promote and every other sentinel."""
        first = self._servers[0]
        for sentinel in self._sentinels:
            fields = self.master(sentinel)
            if (
                fields.get("ip") != first.host
                or fields.get("port") != str(first.port)
                or fields.get("flags") != "master"
                or fields.get("num-slaves") != str(len(self._servers) - 1)
                or fields.get("num-other-sentinels") != str(len(self._sentinels) - 1)
            ):
                return False
            # A replica counts once the sentinel has had its INFO: before, it is not fit
            # to promote and a failover would be refused (NOGOODSLAVE).
            fit = [
                replica
                for replica in self.replicas_of(sentinel)
                if replica.get("flags") == "slave" and replica.get("master-link-status") == "ok"
            ]
            if len(fit) != len(self._servers) - 1:
                return False
        return True

    # -- waiting ---------------------------------------------------------------------

    def wait(
        self,
        condition: Callable[[], bool],
        what: str,
        deadline: float,
        alive: Sequence[ManagedProcess] = (),
    ) -> None:
        """Poll ``condition`` until it holds; raise with the logs' tails at the deadline,
        or at once if a process of ``alive`` has exited."""
        while not condition():
            dead = [p.name for p in alive if not p.running]
            if dead:
                raise DevClusterError(
                    f"{', '.join(dead)} exited while waiting until {what}\n{self.log_tails()}"
                )
            if time.monotonic() >= deadline:
                raise DevClusterError(f"not reached in time: {what}\n{self.log_tails()}")
            time.sleep(_POLL_INTERVAL_S)

    def log_tails(self) -> str:
        """The last lines of every data server's and sentinel's log."""
        return log_tails((*self._servers, *self._sentinels), _TAIL_LINES)
