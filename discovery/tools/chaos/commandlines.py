"""How each server of a chaos run is started: its command line after the interpreter.

:class:`CommandLines` builds a search server's and a data server's flags from the run's
settings; the backend's addresses are read at each call, so a command line is always
the backend's as it is now.
"""

from __future__ import annotations

from collections.abc import Callable

from .config import ChaosConfig
from .processes import Member

__all__ = [
    "ADMIN_TOKEN",
    "CLUSTER_NAME",
    "DATA_DOCS",
    "DATA_DRAIN_GRACE",
    "SEARCH_MAX_CONNECTIONS",
    "CommandLines",
]

CLUSTER_NAME = "chaos"
#: The data servers' admin token in a run with partitions (a scratch cluster's).
ADMIN_TOKEN = "chaos-admin"
#: Documents generated per data server (``--docs``): a hostile query storm computes
#: its shard's most frequent terms from the same corpus.
DATA_DOCS = 300
#: Seconds a draining data server keeps answering (``--drain-grace``): the search
#: servers must stop routing to it within them.
DATA_DRAIN_GRACE = 1.0
#: The search servers' connection cap (``--max-connections``): small, so that the
#: hostile idle flood reaches it with a few hundred sockets.
SEARCH_MAX_CONNECTIONS = 128


class CommandLines:
    """The servers' command lines for ``config``, with the ZooKeeper connection string
    ``zk_hosts()`` and the Redis URL ``redis_url()`` of the run's backend."""

    def __init__(
        self, config: ChaosConfig, zk_hosts: Callable[[], str], redis_url: Callable[[], str]
    ) -> None:
        self._config = config
        self._zk_hosts = zk_hosts
        self._redis_url = redis_url

    def command(self, member: Member) -> list[str]:
        """``member``'s whole command line after the interpreter (its :attr:`Member.argv`
        and the flags every server takes)."""
        config = self._config
        return [
            *member.argv,
            *("--zk", self._zk_hosts(), "--redis", self._redis_url(), "--cluster", CLUSTER_NAME),
            # INFO: kazoo's connection attempts are in the logs when a run fails.
            *("--session-timeout", str(config.session_timeout), "--log-level", "INFO"),
            *("--host", member.address, "--advertise", member.address),
            *(("--admin-token", ADMIN_TOKEN) if member.host is not None else ()),
            *("--port", str(member.port)),
        ]

    def search(self, name: str) -> list[str]:
        """A search server's own flags (its :attr:`Member.argv`)."""
        config = self._config
        return [
            *("-m", "search_server.cli", "--id", name),
            *("--heartbeat-interval", str(config.heartbeat_interval)),
            *("--heartbeat-ttl", str(config.heartbeat_ttl)),
            *("--reconcile-interval", "5", "--timeout-ms", str(config.deadline_ms)),
            # The cluster's shard count: a registration of any other is refused (issue 42).
            *("--shards", str(config.shards)),
            *("--max-connections", str(SEARCH_MAX_CONNECTIONS)),
        ]

    def data(self, name: str, shard: int, replica: int) -> list[str]:
        """A data server's own flags (its :attr:`Member.argv`)."""
        config = self._config
        return [
            *("-m", "data_server.cli", "--id", name, "--docs", str(DATA_DOCS)),
            *("--shard", str(shard), "--replica", str(replica)),
            *("--probe-interval", str(config.probe_interval)),
            *("--probe-timeout", str(config.probe_timeout), "--probe-max-latency", "0.5"),
            *("--fall", str(config.fall), "--rise", str(config.rise)),
            *("--drain-grace", f"{DATA_DRAIN_GRACE:g}"),
            # Every server is hurt a few times in a long run; damping a flapping server
            # is tested elsewhere and would only blur the bounds judged here.
            *("--flap-max", "1000"),
        ]
