"""The data server and its embedded agent, in process, against a real ZooKeeper."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request

import discovery
from data_server.config import DataServerConfig, build_parser
from data_server.corpus import sample_queries
from data_server.server import MAX_QUERY_LENGTH, DataServer
from discovery.adminauth import admin_headers
from discovery.agent.agent import AgentState
from discovery.config import AgentConfig, ClusterConfig, ZkConfig
from discovery.errors import ConfigError, InvalidInstanceError
from discovery.instance import InstanceState, ServiceInstance
from discovery.zk.expiry import expire_session
from discovery.zk.membership import MembershipWatcher
from discovery.zk.paths import DATA_SERVERS_PATH
from tests.support import (
    FAST_AGENT,
    DataServerFactory,
    SessionFactory,
    eventually,
    frequent_terms,
    get_json,
    loop_settled,
    more_probes,
    sample,
    waited,
)


async def _post(server: DataServer, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
    """POST as an operator's client does: with the admin header, and ``headers`` given."""
    kwargs["headers"] = {**admin_headers(), **kwargs.get("headers", {})}
    async with (
        aiohttp.ClientSession() as client,
        client.post(f"{server.url}{path}", json=body, **kwargs) as response,
    ):
        return response.status, await response.json()


async def _get(server: DataServer, path: str, **params: str) -> tuple[int, Any]:
    return await get_json(f"{server.url}{path}", **params)


async def _set_fault(server: DataServer, **fault: Any) -> None:
    status, body = await _post(server, "/admin/fault", fault)
    assert status == 200, body


def _state(server: DataServer) -> AgentState:
    assert server.agent is not None
    return server.agent.status().state


@pytest.mark.smoke
async def test_registers_only_when_ready_with_the_brief_payload(
    make_session: SessionFactory, make_data_server: DataServerFactory
) -> None:
    observer = await make_session()
    async with MembershipWatcher(observer, coalesce_window=0) as watcher:
        changes = watcher.subscribe()
        await waited(anext(changes), "the empty start", timeout=10)
        server = await make_data_server(shard=5, replica=1, docs=400, instance_id="ds-ready")
        change = await waited(anext(changes), "the change set adding ds-ready", timeout=10)
        instance = change.added["ds-ready"]
        # Seen in ZooKeeper means ready: the advertised port answers real searches now.
        query = sample_queries(1, variant=3)[0]
        async with (
            aiohttp.ClientSession() as client,
            client.get(
                f"http://{instance.address}:{instance.port}/search", params={"q": query}
            ) as response,
        ):
            assert response.status == 200
            assert (await response.json())["shard"] == 5
        assert instance.port == server.port
        assert instance.name == "data_servers"
        payload = instance.payload
        assert (payload.shard, payload.replica, payload.docs) == (5, 1, 400)
        assert payload.state is InstanceState.SERVING
        assert payload.version == discovery.__version__  # one version, the package's
        assert instance.enabled
        status, body = await _get(server, "/readyz")
        assert status == 200
        assert body["agent"]["registered"] is True
        changes.close()


async def test_search_answers_top_k_hits(make_data_server: DataServerFactory) -> None:
    server = await make_data_server(shard=2, docs=500)
    queries = sample_queries(30, variant=4)
    answered = 0
    for query in queries:
        status, body = await _get(server, "/search", q=query, k="5")
        assert status == 200
        assert body["shard"] == 2
        assert isinstance(body["took_ms"], float)
        scores = [hit["score"] for hit in body["hits"]]
        assert len(scores) <= 5
        assert scores == sorted(scores, reverse=True)
        assert all(hit["id"].startswith("s2-") for hit in body["hits"])
        answered += bool(scores)
    # Realistic queries over a realistic vocabulary mostly find something.
    assert answered > 20


async def test_every_answer_reports_the_servers_load(make_data_server: DataServerFactory) -> None:
    server = await make_data_server()
    status, body = await _get(server, "/search", q="a")
    assert status == 200
    load = {field: body[field] for field in ("utilization", "qps", "eps")}
    assert all(type(value) is float and value >= 0 for value in load.values()), load
    assert load["qps"] > 0  # the agent's probes and this search were answered
    # Injected errors (500) count as errors per second in the next answers' report.
    await _set_fault(server, mode="error", rate=1.0)
    for _ in range(5):
        status, _ = await _get(server, "/search", q="a")
        assert status == 500
    await _set_fault(server, mode="slow", delay_ms=100)
    # ...and the injected slowness (a sleep inside the admission, no CPU time) in the
    # utilization: five searches in progress 0.1 s each, in a window of 2 to 3 s.
    for _ in range(5):
        status, body = await _get(server, "/search", q="a")
        assert status == 200
    assert body["eps"] >= 1.5, body  # at least the five 500s, within 3 s
    assert body["utilization"] >= 0.15, body
    assert sample(server.registry, "data_server_load_utilization") >= 0.15
    await _set_fault(server, mode="none")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "missing query parameter 'q'"),
        ({"q": "  "}, "missing query parameter 'q'"),
        ({"q": "x" * (MAX_QUERY_LENGTH + 1)}, "longer than"),
        ({"q": "a", "k": "0"}, "'k' must be in 1..1000"),
        ({"q": "a", "k": "1001"}, "'k' must be in 1..1000"),
        ({"q": "a", "k": "ten"}, "'k' must be an integer"),
    ],
)
async def test_bad_queries_get_400_with_a_json_message(
    make_data_server: DataServerFactory, params: dict[str, str], message: str
) -> None:
    server = await make_data_server()
    status, body = await _get(server, "/search", **params)
    assert status == 400
    assert message in body["error"]


async def test_a_bad_timeout_ms_gets_400_naming_it(make_data_server: DataServerFactory) -> None:
    server = await make_data_server()
    for value, message in [
        ("0", "'timeout_ms' must be in 1..600000, got 0"),
        ("-20", "'timeout_ms' must be in 1..600000, got -20"),
        ("600001", "'timeout_ms' must be in 1..600000, got 600001"),
        ("9" * 40, "'timeout_ms' must be in 1..600000, got a 40-digit number"),
        ("soon", "'timeout_ms' must be an integer, got 'soon'"),
        ("1.5", "'timeout_ms' must be an integer"),
        ("", "'timeout_ms' must be an integer"),
    ]:
        status, body = await _get(server, "/search", q="a", timeout_ms=value)
        assert (status, body["parameter"]) == (400, "timeout_ms"), value
        assert message in body["error"]
    # The largest and the smallest are accepted.
    for value in ("600000", "1", "+7"):
        status, _ = await _get(server, "/search", q="a", timeout_ms=value)
        assert status in (200, 504), value  # a budget of 1 ms may run out before it starts


async def test_a_search_past_its_budget_answers_with_the_best_so_far_marked_cut(
    make_data_server: DataServerFactory,
) -> None:
    server = await make_data_server(docs=20_000)
    index = server.index
    assert index is not None
    worst = frequent_terms(index, 150)  # about 100 ms of work, far more than 15
    await loop_settled(server)
    normal = sample_queries(1, variant=6)[0]

    status, body = await _get(server, "/search", q=worst, k="10", timeout_ms="20")

    assert status == 200
    assert body["cut"] is True
    hits = body["hits"]
    assert 0 < len(hits) <= 10
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    # Real documents, with the part of their score found so far.
    every_score = {h.id: h.score for h in index.search_exhaustive(worst, index.document_count)}
    assert all(h["score"] <= every_score[h["id"]] * (1 + 1e-12) for h in hits)
    assert sample(server.registry, "data_server_search_cut_total", answer="hits") == 1

    # An ordinary query is done long before such a budget: complete, not cut.
    status, body = await _get(server, "/search", q=normal, k="10", timeout_ms="20")
    assert (status, body["cut"]) == (200, False)
    assert [h["id"] for h in body["hits"]] == [h.id for h in index.search(normal, 10)]

    # Held (a slow server) past its budget: nothing to answer with.
    await _set_fault(server, mode="slow", delay_ms=100)
    status, body = await _get(server, "/search", q=normal, k="10", timeout_ms="20")
    assert status == 504
    assert body["timeout_ms"] == 20
    assert "budget of 20 ms ran out" in body["error"]
    assert sample(server.registry, "data_server_search_cut_total", answer="timeout") == 1
    assert sample(server.registry, "data_server_search_cut_total", answer="hits") == 1


async def test_healthz_and_ordinary_searches_answer_while_worst_case_searches_run(
    make_data_server: DataServerFactory,
) -> None:
    # A shard whose worst-case query (its 150 most frequent terms) reads 720,000
    # postings: run in one piece, each of four concurrent ones would hold the event
    # loop for a tenth of a second or more, and the agent's probe (max latency 0.25 s)
    # would wait behind them until the agent took its own server offline.
    server = await make_data_server(docs=20_000)
    agent = server.agent
    assert agent is not None
    assert server.index is not None
    worst = frequent_terms(server.index, 150)
    stop = asyncio.Event()
    answered: list[int] = []

    async def worst_case_client() -> None:
        async with aiohttp.ClientSession() as client:
            while not stop.is_set():
                # Budgets no load can run out: 200 means answered whole, never cut.
                params = {"q": worst, "k": "10", "timeout_ms": "10000"}
                async with client.get(f"{server.url}/search", params=params) as response:
                    await response.read()
                    answered.append(response.status)

    clients = [asyncio.create_task(worst_case_client()) for _ in range(4)]
    try:
        await eventually(lambda: len(answered) >= 8, message="worst-case searches answered")
        async with aiohttp.ClientSession() as client:
            for query in sample_queries(10, variant=8):
                for path, params in (
                    ("/healthz", {}),
                    ("/search", {"q": query, "k": "10", "timeout_ms": "10000"}),
                ):
                    async with client.get(f"{server.url}{path}", params=params) as response:
                        assert response.status == 200
                        await response.read()
        # The agent's own probes (a search over HTTP, from its thread) keep passing.
        await more_probes(agent, 5)
        load = len(answered)
        await eventually(lambda: len(answered) >= load + 4, message="the load still runs")
    finally:
        stop.set()
        await asyncio.gather(*clients)

    # The worst-case searches gave the loop back between slices (cut by work done, so
    # the count does not depend on the machine's speed): some 130 each, one if run in
    # one piece. What that does to other requests' latency is bench/bench_worst_case.py's
    # figure, against the unsliced search in the same run.
    slices = sample(server.registry, "data_server_search_slice_seconds_count")
    assert slices >= 20 * len(answered), (slices, len(answered))
    assert set(answered) == {200}
    assert agent.status().registered
    assert _forced_offline(server) == 0  # not even for a moment


def _forced_offline(server: DataServer) -> float:
    """Times the server's agent took it offline for failing probes, for any reason."""
    return sum(
        sample.value
        for family in server.registry.collect()
        if family.name == "discovery_agent_forced_offline"
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def test_search_timeout_ms_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DISCOVERY_SEARCH_TIMEOUT_MS", raising=False)
    assert DataServerConfig.from_args(build_parser().parse_args([])).search_timeout_ms == 1000
    args = build_parser().parse_args(["--search-timeout-ms", "250"])
    assert DataServerConfig.from_args(args).search_timeout_ms == 250
    monkeypatch.setenv("DISCOVERY_SEARCH_TIMEOUT_MS", "3000")
    assert DataServerConfig.from_args(build_parser().parse_args([])).search_timeout_ms == 3000
    for bad in ("0", "600001", "soon"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--search-timeout-ms", bad])
        assert "argument --search-timeout-ms:" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"^--search-timeout-ms / DISCOVERY_SEARCH_TIMEOUT_MS"):
        DataServerConfig(
            zk=ZkConfig(hosts="127.0.0.1:1"),
            cluster=ClusterConfig(),
            agent=AgentConfig(),
            search_timeout_ms=0,
        )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("not json", "body must be JSON"),
        ([1, 2], "JSON object"),
        ({"mode": "explode"}, "'mode' must be one of"),
        ({"mode": "slow"}, "'delay_ms' must be an integer"),
        ({"mode": "slow", "delay_ms": -5}, "'delay_ms' must be an integer"),
        ({"mode": "error", "rate": 1.5}, "'rate' must be a number in 0..1"),
        ({"mode": "error", "rate": True}, "'rate' must be a number in 0..1"),
        ({"mode": "hang", "block_loop": "yes"}, "'block_loop' must be a boolean"),
        ({"mode": "none", "extra": 1}, "unknown fields"),
    ],
)
async def test_bad_admin_input_gets_400_and_changes_nothing(
    make_data_server: DataServerFactory, body: Any, message: str
) -> None:
    server = await make_data_server()
    if isinstance(body, str):
        status, answer = await _post(server, "/admin/fault", data=body)
    else:
        status, answer = await _post(server, "/admin/fault", body)
    assert status == 400
    assert message in answer["error"]
    assert server.faults.fault.mode == "none"
    assert (await _get(server, "/readyz"))[0] == 200  # still registered and serving


async def test_admin_requires_the_token_when_one_is_set(
    make_data_server: DataServerFactory,
) -> None:
    server = await make_data_server(admin_token="s3cret")
    status, body = await _post(server, "/admin/fault", {"mode": "none"})
    assert status == 401
    assert "Bearer" in body["error"]
    status, _ = await _post(
        server, "/admin/fault", {"mode": "none"}, headers={"Authorization": "Bearer wrong"}
    )
    assert status == 403
    status, _ = await _post(server, "/admin/offline", headers={"Authorization": "Bearer s3cret"})
    assert status == 200
    assert _state(server) is AgentState.ADMIN_OFFLINE
    # Searching needs no token.
    assert (await _get(server, "/search", q="a"))[0] == 200


async def test_admin_without_token_is_refused_from_other_hosts(
    make_data_server: DataServerFactory,
) -> None:
    server = await make_data_server()

    class Transport:
        def __init__(self, peer: str) -> None:
            self.peer = peer

        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return (self.peer, 40000) if name == "peername" else default

    def request(peer: str) -> Any:
        return make_mocked_request(
            "POST", "/admin/offline", headers=admin_headers(), transport=Transport(peer)
        )

    refused = server.handlers.refuse_admin(request("10.1.2.3"))
    assert refused is not None
    assert refused.status == 403
    assert server.handlers.refuse_admin(request("127.0.0.1")) is None


@pytest.mark.parametrize(
    ("fault", "kind"),
    [({"mode": "slow", "delay_ms": 400}, "slow"), ({"mode": "error", "rate": 1.0}, "error")],
)
@pytest.mark.smoke
async def test_failing_probes_take_the_server_offline_and_recovery_brings_it_back(
    make_session: SessionFactory,
    make_data_server: DataServerFactory,
    fault: dict[str, Any],
    kind: str,
) -> None:
    observer = await make_session()
    server = await make_data_server(instance_id="ds-sick")
    path = f"{DATA_SERVERS_PATH}/ds-sick"
    await eventually(lambda: observer.exists(path), message="registered")
    assert server.agent is not None
    session_before = server.agent.status()

    await _set_fault(server, **fault)

    await eventually(lambda: _state(server) is AgentState.OFFLINE, message="offline")
    assert await observer.exists(path) is None
    status = server.agent.status()
    assert status.consecutive_failures >= FAST_AGENT.fall
    assert status.reason is not None
    assert status.reason.startswith(f"{FAST_AGENT.fall} failed probes")
    forced = server.registry.get_sample_value(
        "discovery_agent_forced_offline_total", {"reason": kind}
    )
    assert forced == 1

    await _set_fault(server, mode="none")

    await eventually(lambda: _state(server) is AgentState.SERVING, message="serving again")
    await eventually(lambda: observer.exists(path), message="re-registered")
    assert server.agent.status().consecutive_successes >= FAST_AGENT.rise
    assert server.registry.get_sample_value("discovery_agent_readmissions_total") == 1
    assert session_before.ready


async def test_flap_damping_holds_a_flapping_server_out(
    make_session: SessionFactory, make_data_server: DataServerFactory
) -> None:
    observer = await make_session()
    agent_config = dataclasses.replace(FAST_AGENT, flap_max=1, flap_cooldown=1.5)
    server = await make_data_server(instance_id="ds-flap", agent=agent_config)
    path = f"{DATA_SERVERS_PATH}/ds-flap"
    await eventually(lambda: observer.exists(path), message="registered")

    async def flap() -> None:
        await _set_fault(server, mode="error", rate=1.0)
        await eventually(lambda: _state(server) is AgentState.OFFLINE, message="offline")
        await _set_fault(server, mode="none")

    await flap()
    await eventually(lambda: _state(server) is AgentState.SERVING, message="re-admitted once")
    await flap()
    # Healthy again, but one re-admission in the window is the limit: held out.
    await eventually(lambda: _state(server) is AgentState.DAMPED, message="damped")
    assert await observer.exists(path) is None
    assert server.registry.get_sample_value("discovery_agent_flap_damped_total") == 1
    assert server.agent is not None
    damped = server.agent.status()
    assert damped.reason is not None
    assert "flapping" in damped.reason
    # After the cool-down it comes back by itself.
    await eventually(lambda: _state(server) is AgentState.SERVING, message="after cool-down")
    await eventually(lambda: observer.exists(path), message="re-registered")


async def test_update_instance_rewrites_the_node_and_survives_offline_and_online(
    make_session: SessionFactory, make_data_server: DataServerFactory
) -> None:
    """A server whose index grew publishes its new ``docs`` count through the agent: the
    registered node is rewritten in place, and the next registration carries it."""
    observer = await make_session()
    server = await make_data_server(instance_id="ds-update", docs=300)
    agent = server.agent
    assert agent is not None
    path = f"{DATA_SERVERS_PATH}/ds-update"
    await eventually(lambda: observer.exists(path), message="registered")
    raw, created = await observer.get(path)
    created_instance = ServiceInstance.from_json(raw)

    def with_docs(docs: int) -> ServiceInstance:
        # Derived from the agent's instance, so its state and registration time stay.
        current = agent.instance
        return dataclasses.replace(current, payload=dataclasses.replace(current.payload, docs=docs))

    # The blocking flavour, as a threaded server would call it...
    await asyncio.to_thread(agent.update_instance, with_docs(600))
    data, stat = await observer.get(path)
    assert ServiceInstance.from_json(data).payload.docs == 600
    # ...in place: the same node of the same session, one more version.
    assert (stat.czxid, stat.ephemeral_owner) == (created.czxid, created.ephemeral_owner)
    assert stat.version == created.version + 1
    # ...and the awaitable one.
    grown = with_docs(900)
    await agent.aupdate_instance(grown)
    data, _ = await observer.get(path)
    assert ServiceInstance.from_json(data) == grown
    assert agent.instance == grown

    await agent.atake_offline("reindex")
    assert await observer.exists(path) is None
    # What the agent owns is not the caller's to change: an update built from a stale
    # copy (serving, an old registration time) while offline brings nothing back.
    stale = dataclasses.replace(
        created_instance, payload=dataclasses.replace(created_instance.payload, docs=950)
    )
    await agent.aupdate_instance(stale)
    assert await observer.exists(path) is None
    assert agent.status().state is AgentState.ADMIN_OFFLINE
    assert agent.instance.payload.docs == 950
    assert agent.instance.registration_time_utc == grown.registration_time_utc
    with pytest.raises(InvalidInstanceError, match="ds-other"):
        await agent.aupdate_instance(dataclasses.replace(stale, id="ds-other"))
    await agent.abring_online()
    await eventually(lambda: observer.exists(path), message="registered again")
    data, stat = await observer.get(path)
    again = ServiceInstance.from_json(data)
    # A new registration (new node, new registration time, serving again), with the
    # updated count.
    assert again.payload.docs == 950
    assert again.payload.state is InstanceState.SERVING
    assert again.payload.reason is None
    assert again.enabled
    assert again.registration_time_utc >= grown.registration_time_utc
    assert stat.czxid != created.czxid
    # The status is published once the admission is done, just after the node appears.
    await eventually(
        lambda: agent.status().state is AgentState.SERVING, message="serving in the status"
    )


async def test_session_expiry_reregisters_without_operator(
    make_session: SessionFactory, make_data_server: DataServerFactory
) -> None:
    observer = await make_session()
    server = await make_data_server(instance_id="ds-expiry")
    agent = server.agent
    assert agent is not None
    session = agent.session
    assert session is not None
    path = f"{DATA_SERVERS_PATH}/ds-expiry"
    await eventually(lambda: observer.exists(path), message="registered")
    old = session.session_id

    new = await agent.call(expire_session(session))

    assert new != old

    async def owned_by_new_session() -> bool:
        stat = await observer.exists(path)
        return stat is not None and stat.ephemeral_owner == new

    await eventually(owned_by_new_session, message="re-registered in the new session")
    assert agent.status().state is AgentState.SERVING


async def test_expiry_while_offline_does_not_reregister(
    make_session: SessionFactory, make_data_server: DataServerFactory
) -> None:
    observer = await make_session()
    server = await make_data_server(instance_id="ds-expiry-off")
    agent = server.agent
    assert agent is not None
    path = f"{DATA_SERVERS_PATH}/ds-expiry-off"
    await eventually(lambda: observer.exists(path), message="registered")
    await _post(server, "/admin/offline")
    assert await observer.exists(path) is None
    session = agent.session
    assert session is not None

    await agent.call(expire_session(session))
    # Let the probe loop run a few rounds in the new session before looking.
    await more_probes(agent, 3)
    assert await observer.exists(path) is None
    assert agent.status().state is AgentState.ADMIN_OFFLINE

    await _post(server, "/admin/online")
    await eventually(lambda: observer.exists(path), message="online again")


async def test_hang_fault_holds_requests_until_cleared(
    make_data_server: DataServerFactory,
) -> None:
    server = await make_data_server()
    await _set_fault(server, mode="hang")
    pending = asyncio.ensure_future(_get(server, "/search", q="a", timeout_ms="60000"))
    # Held past its budget (the agent takes a second to go offline): dropped when
    # released, not searched.
    expired = asyncio.ensure_future(_get(server, "/search", q="a", timeout_ms="50"))
    await eventually(lambda: _state(server) is AgentState.OFFLINE, message="offline")
    assert not pending.done()
    await _set_fault(server, mode="none")
    status, _ = await waited(pending, "the held search to be answered", timeout=10)
    assert status == 200
    status, body = await waited(expired, "the expired search to be answered", timeout=10)
    assert status == 504
    assert body == {
        "error": "the search's budget of 50 ms ran out before it could start",
        "timeout_ms": 50,
    }
    # (and so were the agent's own probes held past their budget, the default one)
    assert sample(server.registry, "data_server_search_cut_total", answer="timeout") >= 1


async def test_admin_drain_asks_the_owner_to_drain(
    make_session: SessionFactory, make_data_server: DataServerFactory
) -> None:
    observer = await make_session()
    server = await make_data_server(instance_id="ds-admin-drain")
    status, body = await _post(server, "/admin/drain")
    assert (status, body) == (202, {"status": "draining"})
    assert server.drain_requested.is_set()
    # What the CLI does on that event (as on SIGTERM):
    async with MembershipWatcher(observer, coalesce_window=0) as watcher:
        shutdown = asyncio.create_task(server.shutdown(grace=0.5))
        members = await waited(
            watcher.wait_until(
                lambda m: m["ds-admin-drain"].payload.state is InstanceState.DRAINING, timeout=10
            ),
            "ds-admin-drain marked draining",
        )
        assert members["ds-admin-drain"].payload.reason == "draining"
        await waited(shutdown, "ds-admin-drain to shut down", timeout=30)
        await waited(
            watcher.wait_until(lambda m: "ds-admin-drain" not in m, timeout=10),
            "ds-admin-drain deregistered",
        )
