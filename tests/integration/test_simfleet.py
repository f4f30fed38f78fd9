"""The simulated fleet (``discovery.testing.simfleet``) against the real ZooKeeper, and
search servers routing to it through subsets."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import pytest

from discovery.config import ZkConfig
from discovery.instance import ServiceInstance
from discovery.testing.simfleet import MAX_SIZE, SimulatedFleet, address_of
from discovery.zk.paths import DATA_SERVERS_PATH
from search_server.server import SearchServer
from search_server.subsetting import Position, aperture
from tests.support import SearchServerFactory, SessionFactory, all_see, eventually, get_json


def test_addresses_are_distinct_loopback_addresses_outside_127_0() -> None:
    addresses = [address_of(i) for i in range(0, MAX_SIZE, 997)] + [address_of(MAX_SIZE - 1)]
    assert len(set(addresses)) == len(addresses)
    assert address_of(0) == "127.10.0.1"
    assert address_of(MAX_SIZE - 1) == "127.15.249.250"
    with pytest.raises(ValueError, match="index"):
        address_of(MAX_SIZE)


async def test_a_fleet_registers_every_server_and_answers_for_each_address(
    fleet_of: Callable[..., SimulatedFleet], make_session: SessionFactory
) -> None:
    fleet = fleet_of(size=40, shards=4, docs=500, sessions=3)
    await fleet.start()
    session = await make_session()
    assert sorted(await session.get_children(DATA_SERVERS_PATH)) == fleet.ids
    data, _ = await session.get(f"{DATA_SERVERS_PATH}/{fleet.ids[7]}")
    registered = ServiceInstance.from_json(data)
    assert (registered.id, registered.address, registered.port) == (
        "sim-00007",
        "127.10.0.8",
        fleet.port,
    )
    assert (registered.payload.shard, registered.payload.replica) == (3, 1)
    assert registered.payload.docs == 500

    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{address_of(7)}:{fleet.port}/search?q=x&k=3") as response:
            body = await response.json()
        assert response.status == 200
        # At most the k asked for (a search server refuses more), of its 10.
        assert (body["shard"], body["docs"], len(body["hits"])) == (3, 500, 3)
        assert (fleet.served[7], sum(fleet.served)) == (1, 1)
        # The counts over HTTP, for a benchmark in another process: the connection they
        # are asked on is not counted, nor is the request.
        async with http.get(f"http://{address_of(0)}:{fleet.port}/_fleet/stats") as response:
            stats = await response.json()
        assert stats["served"] == list(fleet.served)
        assert stats["connections"][0] == 0
        assert stats["connections"][7] == fleet.connections[7] == 1  # kept alive
        # Not one of its addresses: closed without an answer.
        with pytest.raises(aiohttp.ClientError):
            async with http.get(f"http://127.0.0.1:{fleet.port}/search?q=x") as response:
                await response.read()

        fleet.set_mode(8, "refuse")
        with pytest.raises(aiohttp.ClientError):
            async with http.get(f"http://{address_of(8)}:{fleet.port}/search?q=x") as response:
                await response.read()
        fleet.set_mode(9, "hang")
        with pytest.raises(TimeoutError):
            async with http.get(
                f"http://{address_of(9)}:{fleet.port}/search?q=x",
                timeout=aiohttp.ClientTimeout(total=0.3),
            ) as response:
                await response.read()
        fleet.set_mode([8, 9], "ok")
        for index in (8, 9):
            async with http.get(f"http://{address_of(index)}:{fleet.port}/healthz") as response:
                assert response.status == 200

    await fleet.deregister(7)
    assert fleet.ids[7] not in await session.get_children(DATA_SERVERS_PATH)
    await fleet.register(7)
    await fleet.aclose()  # its sessions closed: their nodes are gone
    assert await session.get_children(DATA_SERVERS_PATH) == []


async def test_three_search_servers_each_route_a_shard_to_its_subset_and_together_to_all(
    fleet_of: Callable[..., SimulatedFleet], make_search_server: SearchServerFactory
) -> None:
    """Two shards of six replicas, subsets of two, three search servers: each takes a
    third of each shard's ring, two whole replicas, and only those get its requests;
    the three together cover every replica."""
    fleet = fleet_of(size=12, shards=2)
    await fleet.start()
    # No hedges: the loser of a hedge has its connection closed (a request still in
    # flight cannot share it), and under load that left a member with none open.
    search = [
        await make_search_server(server_id=f"ss-{i}", subset_size=2, hedge_percent=0.0)
        for i in range(3)
    ]
    await all_see(search, set(fleet.ids))
    await eventually(
        lambda: (
            [s.fanout.position for s in search if s.fanout is not None]
            == [Position(rank, 3) for rank in range(3)]
        ),
        message="each search server knows its place among three",
    )
    query_rounds = 30
    for server in search:
        for _ in range(query_rounds):
            status, body = await get_json(f"{server.url}/search", q="anything", k="5")
            assert (status, body["shards"]["ok"]) == (200, 2)

    covered: set[str] = set()
    for rank, server in enumerate(search):
        assert server.fanout is not None
        assert server.reader is not None
        servers = server.reader.current.servers
        for shard in range(2):
            ids = sorted(i for i in servers if servers[i].payload.shard == shard)
            expected = {ids[index] for index, _ in aperture(len(ids), Position(rank, 3), 2)}
            used = {
                i
                for i in ids
                if (replica := server.fanout.replica(servers[i])) is not None and replica.sent
            }
            assert used == expected, (server.server_id, shard)
            covered |= used
    assert covered == set(fleet.ids)
    assert sum(fleet.served) >= 3 * query_rounds * 2
    # Each search server holds connections to its four members and no other.
    assert sum(1 for open_ in fleet.connections if open_) == 12
    assert max(fleet.connections) <= 3


def _positions(search: list[SearchServer]) -> list[Position]:
    return [s.fanout.position for s in search if s.fanout is not None]


async def test_a_search_server_that_leaves_moves_the_others_subsets(
    fleet_of: Callable[..., SimulatedFleet], make_search_server: SearchServerFactory
) -> None:
    fleet = fleet_of(size=6, shards=1)
    await fleet.start()
    search = [await make_search_server(server_id=f"ss-{i}", subset_size=2) for i in range(3)]
    await eventually(
        lambda: _positions(search) == [Position(r, 3) for r in range(3)],
        message="three positions",
    )
    await search[1].shutdown()
    await eventually(
        lambda: _positions([search[0], search[2]]) == [Position(0, 2), Position(1, 2)],
        message="the two left know they are two",
    )


async def test_a_fleet_in_two_parts_is_one_fleet(
    fleet_of: Callable[..., SimulatedFleet], make_session: SessionFactory
) -> None:
    # A benchmark splits 50,000 servers over processes (each may hold only so many
    # sockets): the parts together register and answer as one fleet would.
    parts = [fleet_of(size=20, shards=4, first=first) for first in (0, 20)]
    for part in parts:
        await part.start()
    session = await make_session()
    assert sorted(await session.get_children(DATA_SERVERS_PATH)) == [
        f"sim-{i:05d}" for i in range(40)
    ]
    second = parts[1]
    data, _ = await session.get(f"{DATA_SERVERS_PATH}/sim-00023")
    registered = ServiceInstance.from_json(data)
    assert (registered.address, registered.port) == (address_of(23), second.port)
    assert (registered.payload.shard, registered.payload.replica) == (3, 5)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{address_of(23)}:{second.port}/search?q=x") as response:
            body = await response.json()
        assert body["shard"] == 3
        # Counted by the part, from its own 0.
        assert second.served[3] == 1
        # The first part does not answer for the second's addresses.
        with pytest.raises(aiohttp.ClientError):
            async with http.get(f"http://{address_of(23)}:{parts[0].port}/search") as response:
                await response.read()


async def test_the_fleet_refuses_bad_settings(zk_hosts: str) -> None:
    config = ZkConfig(hosts=zk_hosts)
    with pytest.raises(ValueError, match="within"):
        SimulatedFleet(config, size=0, shards=1)
    with pytest.raises(ValueError, match="within"):
        SimulatedFleet(config, size=2, shards=1, first=MAX_SIZE - 1)
    with pytest.raises(ValueError, match="within"):
        SimulatedFleet(config, size=2, shards=1, first=-1)
    with pytest.raises(ValueError, match="shards"):
        SimulatedFleet(config, size=5, shards=0)
    fleet = SimulatedFleet(config, size=5, shards=1)
    with pytest.raises(ValueError, match="mode"):
        fleet.set_mode(1, "broken")  # type: ignore[arg-type]
