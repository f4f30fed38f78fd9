"""The network links of a chaos run with partitions, and the hand that cuts them.

:class:`Links` drops chosen traffic with iptables inside one server's namespace of a
:class:`~discovery.testing.netns.NetworkLab`, and heals it again. Every rule is an
``iptables`` process, so the coroutines run them in a thread, off the loop that times
the queries.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from discovery.testing.netns import Cut, Host, NetworkLab

from .processes import Member

__all__ = ["Links"]


class Links:
    """Cut and heal the links of the run's servers in ``lab`` (None: no partitions).

    ``zookeeper()`` gives each ZooKeeper server's client ``(address, port)``,
    ``redis_ports()`` every port a Redis client of the run may use; ``search`` is the
    run's search servers by name and ``zk_hosts()`` the ZooKeeper servers' namespaces.
    Cutting in a run without partitions, or an unknown link, raises ``ValueError``.
    """

    def __init__(
        self,
        lab: NetworkLab | None,
        *,
        zookeeper: Callable[[], list[tuple[str, int]]],
        redis_ports: Callable[[], list[int]],
        search: Mapping[str, Member],
        zk_hosts: Callable[[], Sequence[Host]],
    ) -> None:
        self._lab = lab
        self._zookeeper = zookeeper
        self._redis_ports = redis_ports
        self._search = search
        self._zk_hosts = zk_hosts
        self._cuts: dict[str, list[Cut]] = {}

    async def cut(self, member: Member, what: str) -> None:
        """Cut ``member`` off: ``zookeeper`` (every ZooKeeper client port), ``redis``
        (the Redis port; with sentinels every data server's and every sentinel's, so
        that it can neither reach the primary nor learn of another), or ``search``
        (every search server's traffic to a data server's port).

        In a thread: each rule is an ``iptables`` process, tens of milliseconds that
        the harness's loop (which times the queries) must not spend blocked.
        """
        await asyncio.to_thread(self._cut, member, what)

    async def heal(self, member: Member) -> None:
        await asyncio.to_thread(self._heal_key, member.name)

    @contextlib.asynccontextmanager
    async def cut_off(self, member: Member, what: str) -> AsyncIterator[None]:
        """:meth:`cut` ``member`` for the block and :meth:`heal` it however the block
        ends: a fault that raised midway must not leave the next faults a cut link."""
        await self.cut(member, what)
        try:
            yield
        finally:
            await self.heal(member)

    def _cut(self, member: Member, what: str) -> None:
        lab, host = self._lab, member.host
        if lab is None or host is None:
            raise ValueError("a run without partitions has no links to cut")
        cuts = self._cuts.setdefault(member.name, [])
        if what == "zookeeper":
            for address, port in self._zookeeper():
                cuts.append(lab.cut(host, address=address, port=port))
        elif what == "redis":
            for port in self._redis_ports():
                cuts.append(lab.cut(host, address=lab.gateway, port=port))
        elif what == "search":
            for other in self._search.values():
                if other.host is not None:
                    cuts.append(
                        lab.cut(host, address=other.host.address, port=member.port, served=True)
                    )
        else:
            raise ValueError(f"unknown link {what!r}")

    async def cut_zookeeper_peers(self, index: int) -> None:
        """Cut ZooKeeper server ``index`` from its peers (every port both ways, its
        clients untouched); :meth:`heal_zookeeper_peers` undoes it."""
        await asyncio.to_thread(self._cut_peers, index)

    async def heal_zookeeper_peers(self, index: int) -> None:
        await asyncio.to_thread(self._heal_key, f"zk{index + 1}")

    def _cut_peers(self, index: int) -> None:
        lab, hosts = self._lab, self._zk_hosts()
        if lab is None or not hosts:
            raise ValueError("a run without partitions has no links to cut")
        cuts = self._cuts.setdefault(f"zk{index + 1}", [])
        for peer, other in enumerate(hosts):
            if peer != index:
                cuts.append(lab.cut(hosts[index], address=other.address))

    def _heal_key(self, key: str) -> None:
        for cut in self._cuts.pop(key, []):
            cut.heal()
