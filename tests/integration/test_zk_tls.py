"""ZooKeeper over TLS, against a real ZooKeeper whose only client port is TLS.

The server (``ssl.clientAuth=need``) has a certificate naming ``localhost`` only, from a
throwaway CA (:mod:`discovery.testing.tls`), so that connecting to ``127.0.0.1`` is a
wrong host name. A client must verify the server (chain and name) and present a
certificate of that CA; every refusal fails ``start()`` at once naming TLS, well
before the connect timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from prometheus_client import CollectorRegistry

from data_server.config import DataServerConfig
from data_server.server import DataServer
from discovery.config import ClusterConfig, ZkConfig
from discovery.errors import ZkConnectionError
from discovery.instance import ServiceInstance
from discovery.metrics import SessionMetrics
from discovery.testing import ZooKeeperEnsemble
from discovery.testing.tls import DevPki, make_dev_pki
from discovery.testing.zookeeper import ZooKeeperTls
from discovery.tools import main as cli
from discovery.tools.zkexporter import ZkExporter
from discovery.zk.abandon import AbandonedSessions
from discovery.zk.acl import CREATE, READ
from discovery.zk.expiry import expire_session
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.session import SessionState, ZkSession
from discovery.zk.tls import KazooTls
from tests.support import (
    FAST_AGENT,
    bounded_teardown,
    eventually,
    instance_of,
    next_change,
    sample,
)

TICK_TIME_MS = 100
SESSION_TIMEOUT = 2.0
# A refusal must come long before this: without the handshake tried at start, kazoo
# would retry it until the connect timeout.
SLOW_CONNECT = 60.0
PROMPT = SLOW_CONNECT / 2


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    """The ensemble's CA, its server certificate (``localhost`` only) and a client one."""
    return make_dev_pki(tmp_path_factory.mktemp("zk-pki"), ip_addresses=())


@pytest.fixture(scope="module")
def tls_zk(tmp_path_factory: pytest.TempPathFactory, pki: DevPki) -> Iterator[ZooKeeperEnsemble]:
    """A standalone ZooKeeper with only a TLS client port, requiring client certificates."""
    ensemble = ZooKeeperEnsemble(
        1,
        tmp_path_factory.mktemp("tls-zk"),
        tick_time_ms=TICK_TIME_MS,
        tls=ZooKeeperTls(pki, client_auth="need"),
    )
    ensemble.start()
    yield ensemble
    ensemble.stop()


def tls_config(pki: DevPki, hosts: str, **fields: object) -> ZkConfig:
    """A client of the ensemble: its CA and the client certificate, unless overridden."""
    settings: dict[str, object] = {
        "tls": True,
        "tls_ca": str(pki.ca_cert),
        "tls_cert": str(pki.client_cert),
        "tls_key": str(pki.client_key),
        "session_timeout": SESSION_TIMEOUT,
        "connect_timeout": 20.0,
    }
    settings.update(fields)
    return ZkConfig(hosts, **settings)  # type: ignore[arg-type]


@pytest.fixture
def tls_hosts(tls_zk: ZooKeeperEnsemble, pki: DevPki) -> Iterator[str]:
    """``localhost:<secure port>/<a fresh chroot>``, deleted afterwards."""
    servers = f"localhost:{tls_zk.servers[0].client_port}"
    tls = KazooTls.from_config(tls_config(pki, servers))
    assert tls is not None
    admin = KazooClient(hosts=servers, timeout=10, **tls.client_options())
    admin.start(timeout=15)
    chroot = f"/test-{uuid.uuid4().hex[:8]}"
    try:
        admin.ensure_path(chroot)
        yield servers + chroot
        with contextlib.suppress(Exception):
            admin.delete(chroot, recursive=True)
    finally:
        admin.stop()
        admin.close()


@pytest.fixture
async def sessions() -> AsyncIterator[list[ZkSession]]:
    """Sessions a test started; all closed afterwards."""
    started: list[ZkSession] = []
    yield started
    await bounded_teardown("sessions", *(session.aclose() for session in started))


async def session_of(
    config: ZkConfig, started: list[ZkSession], registry: CollectorRegistry | None = None
) -> ZkSession:
    session = ZkSession.from_config(config, registry=registry)
    started.append(session)
    await session.start()
    return session


async def refusal(config: ZkConfig) -> str:
    """The message of ``config``'s refused start, which must come promptly."""
    session = ZkSession.from_config(config)
    began = time.monotonic()
    try:
        with pytest.raises(ZkConnectionError) as refused:
            await session.start()
    finally:
        await session.aclose()
    elapsed = time.monotonic() - began
    assert elapsed < PROMPT, f"refused only after {elapsed:.1f}s: {refused.value}"
    return str(refused.value)


async def test_a_data_server_registers_over_tls_and_is_read_back(
    pki: DevPki, tls_hosts: str, sessions: list[ZkSession]
) -> None:
    server = DataServer(
        DataServerConfig(
            zk=tls_config(pki, tls_hosts),
            cluster=ClusterConfig(),
            agent=FAST_AGENT,
            port=0,
            docs=100,
        )
    )
    try:
        await server.start()
        agent = server.agent
        assert agent is not None
        await eventually(lambda: agent.status().registered, message="data server registered")
        reader = await session_of(tls_config(pki, tls_hosts), sessions)
        instance = instance_of(server)
        data, stat = await reader.get(f"{DATA_SERVERS_PATH}/{instance.id}")
        assert ServiceInstance.from_json(data) == instance
        assert stat.ephemeral_owner not in (0, None)
    finally:
        await bounded_teardown("data server", server.shutdown(grace=0))


async def test_a_server_certificate_of_another_ca_is_refused_naming_tls(
    pki: DevPki, tls_hosts: str, tmp_path: Path
) -> None:
    other = make_dev_pki(tmp_path / "other-ca")
    message = await refusal(
        tls_config(pki, tls_hosts, tls_ca=str(other.ca_cert), connect_timeout=SLOW_CONNECT)
    )
    assert "TLS handshake with ZooKeeper refused" in message
    assert "certificate is not accepted" in message
    assert "--zk-tls-ca" in message


async def test_a_certificate_that_does_not_name_the_host_is_refused(
    tls_zk: ZooKeeperEnsemble, pki: DevPki
) -> None:
    # The certificate names localhost; the same server by its address is another name.
    hosts = f"127.0.0.1:{tls_zk.servers[0].client_port}"
    message = await refusal(tls_config(pki, hosts, connect_timeout=SLOW_CONNECT))
    assert "TLS handshake with ZooKeeper refused" in message
    assert f"{hosts}: its certificate is not accepted" in message
    assert "127.0.0.1" in message.partition("not accepted:")[2]


async def test_a_client_without_a_certificate_is_refused(pki: DevPki, tls_hosts: str) -> None:
    message = await refusal(
        tls_config(pki, tls_hosts, tls_cert=None, tls_key=None, connect_timeout=SLOW_CONNECT)
    )
    assert "TLS handshake with ZooKeeper refused" in message
    assert "refused our client certificate" in message


async def test_a_plaintext_client_cannot_use_the_secure_port(tls_hosts: str) -> None:
    # No plaintext port is open; the secure one closes on a client that speaks no TLS.
    session = ZkSession.from_config(ZkConfig(tls_hosts, connect_timeout=3.0))
    try:
        with pytest.raises(ZkConnectionError, match="answered within"):
            await session.start()
    finally:
        await session.aclose()


async def test_a_tls_client_of_a_plaintext_server_is_told_so(
    zk_server: ZooKeeperEnsemble, pki: DevPki
) -> None:
    message = await refusal(tls_config(pki, zk_server.hosts, connect_timeout=SLOW_CONNECT))
    assert "TLS handshake with ZooKeeper refused" in message
    assert "secureClientPort" in message


async def test_an_abandoned_session_is_closed_over_tls(
    pki: DevPki, tls_hosts: str, sessions: list[ZkSession]
) -> None:
    owner = await session_of(tls_config(pki, tls_hosts), sessions)
    old = owner.session_id
    registry = CollectorRegistry()
    # What a connection does with the session it gave up on (the watchdog's), here with
    # the owner's live session: closed from a second client, speaking TLS as the
    # connection's own client does.
    closer = AbandonedSessions(
        hosts=lambda: owner.hosts,
        timeout=10.0,
        metrics=SessionMetrics(registry),
        tls=lambda: KazooTls.of(owner.client),
    )
    events = owner.subscribe()
    try:
        closer.connected(owner.client.client_id, old)
        closer.abandon()
        closer.connected(None, None)  # another session is connected: close the old one

        def closes(result: str) -> float:
            return sample(registry, "discovery_zk_abandoned_sessions_closed_total", result=result)

        await eventually(lambda: closes("closed") + closes("failed") >= 1, message="a close")
        # "failed": the closing client could not attach (a plaintext one is refused).
        assert (closes("closed"), closes("failed")) == (1, 0)
        # The ensemble closed the owner's session: it starts a new one.
        fresh = await next_change(
            events, lambda e: e.state is SessionState.CONNECTED and e.new_session, "a new session"
        )
        assert fresh.session_id != old
    finally:
        events.close()
        await closer.aclose()


async def test_a_session_is_expired_over_tls(
    pki: DevPki, tls_hosts: str, sessions: list[ZkSession]
) -> None:
    victim = await session_of(tls_config(pki, tls_hosts), sessions)
    old = victim.session_id
    assert await expire_session(victim, timeout=30) != old


async def test_the_zk_exporter_reads_mntr_over_tls(tls_zk: ZooKeeperEnsemble, pki: DevPki) -> None:
    tls = KazooTls.from_config(tls_config(pki, "localhost"))
    assert tls is not None
    servers = [("localhost", tls_zk.servers[0].client_port)]
    registry = CollectorRegistry()
    plain = ZkExporter(servers, CollectorRegistry(), timeout=2.0)
    secure = ZkExporter(servers, registry, timeout=10.0, context=tls.ssl_context())
    (refused,) = await plain.poll()
    (reading,) = await secure.poll()
    assert not refused.up
    assert reading.up, reading.error
    assert reading.words["server_state"] == "standalone"
    assert sample(registry, "zookeeper_up", server=f"localhost:{servers[0][1]}") == 1


async def test_zk_init_lays_out_the_tree_over_tls(
    tls_zk: ZooKeeperEnsemble,
    pki: DevPki,
    sessions: list[ZkSession],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The compose topology's zk-init: an ensemble with only a TLS port, client
    certificates required; the tree is made, then found unchanged, and its ACLs hold."""
    servers = f"localhost:{tls_zk.servers[0].client_port}"
    chroot = f"/zkinit-{uuid.uuid4().hex[:8]}"
    admin = "admin:admin-pw"
    args = ["zk-init", "--zk", servers + chroot, "--admin-auth", admin]
    args += ["--data-identities", "data:data-pw", "--search-identities", "search:search-pw"]
    args += ["--zk-tls", "--zk-tls-ca", str(pki.ca_cert)]
    args += ["--zk-tls-cert", str(pki.client_cert), "--zk-tls-key", str(pki.client_key)]
    args += ["--zk-connect-timeout", "20", "--json"]
    try:
        assert await asyncio.to_thread(cli.main, args) == 0
        first = json.loads(capsys.readouterr().out)
        assert await asyncio.to_thread(cli.main, args) == 0
        second = json.loads(capsys.readouterr().out)
        assert first["chroot"] == chroot
        assert {node["action"] for node in first["nodes"]} == {"created"}
        assert {node["action"] for node in second["nodes"]} == {"unchanged"}
        reader = await session_of(tls_config(pki, servers), sessions)
        acl = await reader.get_acls(chroot + DATA_SERVERS_PATH)
        granted = {(entry.id.scheme, entry.id.id.partition(":")[0]): entry.perms for entry in acl}
        assert granted[("digest", "data")] == CREATE | READ
        assert granted[("world", "anyone")] == READ
    finally:
        cleaner = await session_of(tls_config(pki, servers, auth=admin), sessions)
        with contextlib.suppress(Exception):
            await _delete_tree(cleaner, chroot)


async def _delete_tree(session: ZkSession, path: str) -> None:
    for child in await session.get_children(path):
        await _delete_tree(session, f"{path}/{child}")
    await session.delete(path)
