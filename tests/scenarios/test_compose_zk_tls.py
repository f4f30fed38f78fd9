"""docker-compose.yml's ZooKeeper over TLS: clients, members, and the certificates.

Nothing runs in containers here (``make compose-check`` runs the topology): every
ZooKeeper client of the file is parsed by our own parsers with its environment and
secrets (:mod:`tests.scenarios.composefile`), the ZooKeeper image's entrypoint writes
each member's zoo.cfg from its service's environment (a stand-in ``java`` records what
would run), and the certificates are those ``make compose-secrets`` makes, checked with
``openssl``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from data_server.config import DataServerConfig, FleetConfig
from discovery.config import ZkConfig
from discovery.testing.tls import Authority, signed_by
from search_server.config import SearchServerConfig
from tests.scenarios import composefile as cf
from tests.scenarios.composefile import ROOT, Process

SECURE_PORT = 2281
PLAINTEXT_PORT = 2181
ENTRYPOINT = ROOT / "deploy" / "docker" / "zookeeper-entrypoint.sh"
NETTY_CODEC = "/usr/share/java/netty-codec.jar"


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return cf.load(tmp_path_factory)


def _zk_settings(process: Process) -> ZkConfig | None:
    """The ZooKeeper client settings ``process`` runs with (None: it has none)."""
    if process.kind == "data-server loadgen":
        return None
    settings = cf.settings(process)
    if isinstance(settings, FleetConfig | DataServerConfig | SearchServerConfig):
        return cf.template(settings).zk
    assert isinstance(settings, argparse.Namespace), settings
    if not hasattr(settings, "zk"):
        return None
    # zk-init and zk-exporter: their flags, checked as the servers' are.
    return ZkConfig(
        settings.zk,
        tls=settings.zk_tls,
        tls_ca=settings.zk_tls_ca,
        tls_cert=settings.zk_tls_cert,
        tls_key=settings.zk_tls_key,
    )


def _clients(compose: dict[str, Any]) -> list[tuple[Process, ZkConfig]]:
    found = []
    for process in cf.processes(compose):
        zk = _zk_settings(process)
        if zk is not None:
            found.append((process, zk))
    return found


def _members(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in cf.services(compose).items()
        if cf.image(service).startswith("search-discovery-zookeeper:")
    }


def _authorities(compose: dict[str, Any]) -> tuple[Authority, Authority]:
    """The clients' CA and the quorum CA as made for this module."""
    files = cf.secret_files(compose)
    clients, quorum = files["zk_ca"], files["zk_quorum_ca"]
    return (
        Authority(clients, clients.with_suffix(".key")),
        Authority(quorum, quorum.with_suffix(".key")),
    )


def _dns_names(cert: Path) -> set[str]:
    """The DNS names of a certificate's subjectAltName."""
    shown = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(cert)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return set(re.findall(r"DNS:([^,\s]+)", shown))


def test_every_zookeeper_client_speaks_tls_to_the_secure_port_with_its_roles_certificate(
    compose: dict[str, Any],
) -> None:
    """Servers, fleets, zk-init and the exporter: TLS, the compose CA, a certificate of
    their own role (one per kind of container, held by no other kind), port 2281 only."""
    files = cf.secret_files(compose)
    clients_ca, _ = _authorities(compose)
    by_file = {path: name for name, path in files.items()}
    clients = _clients(compose)
    kinds: dict[str, set[str]] = {}
    for process, zk in clients:
        where = process.service
        assert zk.tls, f"{where}: ZooKeeper without TLS"
        assert zk.tls_ca is not None
        assert zk.tls_cert is not None
        assert zk.tls_key is not None
        # The paths name this service's own mounts (composefile maps only those).
        assert Path(zk.tls_ca) == files["zk_ca"], f"{where}: CA {zk.tls_ca}"
        cert, key = by_file.get(Path(zk.tls_cert)), by_file.get(Path(zk.tls_key))
        assert cert in process.secrets, f"{where}: certificate {zk.tls_cert} not mounted"
        assert key in process.secrets, f"{where}: key {zk.tls_key} not mounted"
        assert signed_by(Path(zk.tls_cert), clients_ca), f"{where}: not signed by zk_ca"
        kinds.setdefault(process.kind, set()).add(cert)
        servers = zk.hosts.partition("/")[0].split(",")
        ports = {int(server.rpartition(":")[2]) for server in servers}
        assert ports == {SECURE_PORT}, f"{where}: --zk {zk.hosts}"
        # Nothing else of ZooKeeper's TLS: no other role's certificate or key.
        others = {s for s in process.secrets if s.startswith("zk_client_")} - {cert, key}
        assert not others, f"{where} also mounts {sorted(others)}"
    assert set(kinds) == {
        "search-server",
        "data-server fleet",
        "discovery zk-init",
        "discovery zk-exporter",
    }
    for kind, certs in kinds.items():
        assert len(certs) == 1, f"{kind}: {sorted(certs)}"
        (cert,) = certs
        holders = [kind for kind, held in kinds.items() if cert in held]
        assert holders == [kind], f"{cert} is held by {holders}"


def test_no_container_reaches_zookeepers_plaintext_port(compose: dict[str, Any]) -> None:
    """2181 appears only in the members' health check, on their own loopback; the load
    generator holds no ZooKeeper setting or certificate at all."""
    members = _members(compose)
    for name, service in cf.services(compose).items():
        text = " ".join([*cf.argv(service), *cf.environment(service).values()])
        assert f":{PLAINTEXT_PORT}" not in text, name
        if name in members:
            check = " ".join(service["healthcheck"]["test"])
            assert f"127.0.0.1 {PLAINTEXT_PORT}" in check, name
    (loadgen,) = cf.of_kind(compose, "data-server loadgen")
    assert not [k for k in loadgen.env if k.startswith("DISCOVERY_ZK")], loadgen.env
    assert not [s for s in loadgen.secrets if s.startswith("zk")], loadgen.secrets


def _zoo_cfg(
    compose: dict[str, Any], name: str, service: dict[str, Any], tmp_path: Path
) -> tuple[dict[str, str], list[str]]:
    """What the image's entrypoint writes for member ``name`` (its environment and its
    secrets, by the files made here) and the java command line it would exec."""
    files = cf.secret_files(compose)
    mounts = {path: str(files[secret]) for path, secret in cf.mounted(service).items()}
    bin_dir, conf, data = tmp_path / "bin", tmp_path / "conf", tmp_path / "data"
    for directory in (bin_dir, conf, data):
        directory.mkdir(parents=True)
    recorded = tmp_path / "java-argv"
    java = bin_dir / "java"
    java.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {recorded}\n', encoding="ascii")
    java.chmod(0o755)
    env = {k: mounts.get(v, v) for k, v in cf.environment(service).items()}
    env |= {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "ZOO_CONF_DIR": str(conf),
        "ZOO_DATA_DIR": str(data),
    }
    done = subprocess.run(
        ["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"{name}: {done.stderr}"
    lines = (conf / "zoo.cfg").read_text(encoding="utf-8").splitlines()
    config = dict(line.split("=", 1) for line in lines if "=" in line)
    assert (data / "myid").read_text().strip() == env["ZOO_MY_ID"]
    return config, recorded.read_text(encoding="utf-8").splitlines()


def test_members_serve_clients_over_tls_only_and_require_certificates(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    """Each member's zoo.cfg: the secure port for clients with ssl.clientAuth=need, its
    own certificate naming it, the plaintext port on loopback only; the quorum over TLS
    with certificates of a CA that signs nothing else; Netty on the classpath."""
    clients_ca, quorum_ca = _authorities(compose)
    members = _members(compose)
    assert len(members) == 3
    keystores = set()
    for name, service in members.items():
        config, java = _zoo_cfg(compose, name, service, tmp_path / name)
        hostname = str(service.get("hostname", name))
        assert config["secureClientPort"] == str(SECURE_PORT), name
        assert "secureClientPortAddress" not in config, name  # every interface
        assert config["clientPort"] == str(PLAINTEXT_PORT), name
        assert config["clientPortAddress"] == "127.0.0.1", name
        assert config["ssl.clientAuth"] == "need", name
        assert config["serverCnxnFactory"].endswith(".NettyServerCnxnFactory"), name
        assert config["ssl.trustStore.location"] == str(clients_ca.cert), name
        assert config["ssl.keyStore.type"] == config["ssl.trustStore.type"] == "PEM", name
        keystore = Path(config["ssl.keyStore.location"])
        assert signed_by(keystore, clients_ca), name
        assert _dns_names(keystore) == {hostname}, name
        # The quorum: TLS both ways, only the quorum CA's certificates accepted.
        assert config["sslQuorum"] == "true", name
        assert config["ssl.quorum.clientAuth"] == "need", name
        assert config["ssl.quorum.trustStore.location"] == str(quorum_ca.cert), name
        quorum_keystore = Path(config["ssl.quorum.keyStore.location"])
        assert signed_by(quorum_keystore, quorum_ca), name
        assert not signed_by(quorum_keystore, clients_ca), name
        assert _dns_names(quorum_keystore) == {hostname}, name
        keystores |= {keystore, quorum_keystore}
        classpath = java[java.index("-cp") + 1].split(":")
        assert NETTY_CODEC in classpath, name
        assert java[-2:] == [
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(tmp_path / name / "conf" / "zoo.cfg"),
        ], java
    assert len(keystores) == 6, "each member has key stores of its own"
    # No client certificate is good for the quorum: its CA signed none of them.
    for secret, path in cf.secret_files(compose).items():
        if secret.startswith("zk_client_") and secret.endswith("_cert"):
            assert not signed_by(path, quorum_ca), secret


def test_the_cas_keys_stay_on_the_host(compose: dict[str, Any]) -> None:
    files = cf.secret_files(compose)
    clients_ca, quorum_ca = _authorities(compose)
    for authority in (clients_ca, quorum_ca):
        assert authority.key.stat().st_mode & 0o777 == 0o600
        assert authority.key not in files.values(), f"{authority.key.name} is a compose secret"


def test_certificates_are_kept_and_made_again_when_their_ca_is(tmp_path: Path) -> None:
    """A second run keeps every certificate (members and clients go on trusting each
    other); a CA made again (its key lost) has every certificate it signs made again."""
    secrets = cf.compose_secrets
    secrets.ensure(tmp_path, "demo")
    certificates = sorted(tmp_path.glob("*.pem")) + sorted(tmp_path.glob("zk_client_*.crt"))
    assert len(certificates) == 6 + len(secrets.ZK_CLIENTS)
    before = {path: path.read_bytes() for path in certificates}
    assert secrets.ensure(tmp_path, "demo") == []
    assert {path: path.read_bytes() for path in certificates} == before

    (tmp_path / "zk_ca.key").unlink()
    made = secrets.ensure(tmp_path, "demo")
    renewed = {"zk_ca", "zk1", "zk2", "zk3"} | {f"zk_client_{r}" for r in secrets.ZK_CLIENTS}
    assert set(made) == renewed
    clients_ca = Authority(tmp_path / "zk_ca.crt", tmp_path / "zk_ca.key")
    for path in certificates:
        if "quorum" in path.name:
            assert path.read_bytes() == before[path], f"{path.name}: its CA was kept"
        else:
            assert signed_by(path, clients_ca), path.name
