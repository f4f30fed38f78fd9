"""ZooKeeper's TLS settings: the ``--zk-tls*`` flags and variables, their errors naming
the flag, and the kazoo clients they make (chain and host name always verified).

Real certificates from ``openssl`` (:func:`~discovery.testing.tls.make_dev_pki`); no
server: the handshakes are in tests/integration/test_zk_tls.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from data_server.config import DataServerConfig
from data_server.config import build_parser as build_data_parser
from discovery.cli.options import ZK_OPTIONS, add_options, zk_config
from discovery.config import ZkConfig
from discovery.errors import ConfigError
from discovery.testing.tls import DevPki, make_dev_pki
from discovery.tools.main import main as discovery_main
from discovery.zk.clients import client_factory
from discovery.zk.identity import AclIdentity
from discovery.zk.tls import KazooTls
from search_server.config import SearchServerConfig
from search_server.config import build_parser as build_search_parser

HOSTS = "zk1:2281,zk2:2281/prod"
ENV = ("DISCOVERY_ZK_TLS", "DISCOVERY_ZK_TLS_CA", "DISCOVERY_ZK_TLS_CERT", "DISCOVERY_ZK_TLS_KEY")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return make_dev_pki(tmp_path_factory.mktemp("pki"))


def parse(argv: list[str], environ: dict[str, str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_options(parser, ZK_OPTIONS, environ or {})
    return parser.parse_args(argv)


def test_off_by_default() -> None:
    config = zk_config(parse([]))
    assert (config.tls, config.tls_ca, config.tls_cert, config.tls_key) == (False, None, None, None)
    assert KazooTls.from_config(config) is None
    client = client_factory(config, AclIdentity.from_auth(None))()
    assert client.use_ssl is False


def test_flags_and_variables_build_the_config(pki: DevPki) -> None:
    flags = zk_config(
        parse(
            [
                "--zk-tls",
                "--zk-tls-ca",
                str(pki.ca_cert),
                "--zk-tls-cert",
                str(pki.client_cert),
                "--zk-tls-key",
                str(pki.client_key),
            ]
        )
    )
    variables = zk_config(
        parse(
            [],
            {
                "DISCOVERY_ZK_TLS": "1",
                "DISCOVERY_ZK_TLS_CA": str(pki.ca_cert),
                "DISCOVERY_ZK_TLS_CERT": str(pki.client_cert),
                "DISCOVERY_ZK_TLS_KEY": str(pki.client_key),
            },
        )
    )
    for config in (flags, variables):
        assert config.tls is True
        assert (config.tls_ca, config.tls_cert, config.tls_key) == (
            str(pki.ca_cert),
            str(pki.client_cert),
            str(pki.client_key),
        )
    # A flag wins over its variable.
    assert zk_config(parse(["--no-zk-tls"], {"DISCOVERY_ZK_TLS": "1"})).tls is False


def test_every_server_takes_the_flags(pki: DevPki) -> None:
    argv = ["--zk-tls", "--zk-tls-ca", str(pki.ca_cert)]
    data = DataServerConfig.from_args(build_data_parser().parse_args(argv))
    search = SearchServerConfig.from_args(build_search_parser().parse_args(argv))
    for config in (data.zk, search.zk):
        assert (config.tls, config.tls_ca) == (True, str(pki.ca_cert))


@pytest.mark.parametrize(
    ("flag", "path"),
    [
        ("--zk-tls-ca", "ca_cert"),
        ("--zk-tls-cert", "client_cert"),
        ("--zk-tls-key", "client_key"),
    ],
)
def test_a_tls_file_without_zk_tls_is_refused_naming_the_flag(
    pki: DevPki, flag: str, path: str
) -> None:
    args = parse([flag, str(getattr(pki, path))])
    with pytest.raises(ConfigError, match=f"^{flag} / DISCOVERY_ZK_TLS_.* needs --zk-tls"):
        zk_config(args)


@pytest.mark.parametrize("given", ["cert", "key"])
def test_certificate_and_key_go_together(pki: DevPki, given: str) -> None:
    files = (
        {"tls_cert": str(pki.client_cert)} if given == "cert" else {"tls_key": str(pki.client_key)}
    )
    with pytest.raises(
        ConfigError, match=r"--zk-tls-cert and --zk-tls-key .* give both or neither"
    ):
        ZkConfig(HOSTS, tls=True, **files)


def test_a_missing_file_is_refused_naming_the_flag(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere.crt")
    with pytest.raises(ConfigError, match="--zk-tls-ca / DISCOVERY_ZK_TLS_CA: no such file"):
        ZkConfig(HOSTS, tls=True, tls_ca=missing)
    # From the command line argparse says so first, naming the flag (exit status 2).
    with pytest.raises(SystemExit) as exited:
        parse(["--zk-tls", "--zk-tls-ca", missing])
    assert exited.value.code == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_refused_naming_the_flag(pki: DevPki, tmp_path: Path) -> None:
    locked = tmp_path / "locked.key"
    shutil.copy(pki.client_key, locked)
    locked.chmod(0)
    with pytest.raises(ConfigError, match="--zk-tls-key / DISCOVERY_ZK_TLS_KEY: file not readable"):
        ZkConfig(HOSTS, tls=True, tls_cert=str(pki.client_cert), tls_key=str(locked))


def test_a_ca_file_without_a_certificate_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "ca.crt"
    bogus.write_text("not a certificate\n", encoding="ascii")
    with pytest.raises(ConfigError, match=r"--zk-tls-ca / DISCOVERY_ZK_TLS_CA: .* no usable PEM"):
        ZkConfig(HOSTS, tls=True, tls_ca=str(bogus))


def test_a_key_of_another_certificate_is_refused(pki: DevPki) -> None:
    with pytest.raises(ConfigError, match="--zk-tls-cert / --zk-tls-key: cannot load"):
        ZkConfig(HOSTS, tls=True, tls_cert=str(pki.client_cert), tls_key=str(pki.server_key))


def test_an_encrypted_key_is_refused_without_a_prompt(pki: DevPki, tmp_path: Path) -> None:
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(
        [
            *("openssl", "pkey", "-aes256", "-passout", "pass:secret"),
            *("-in", str(pki.client_key), "-out", str(encrypted)),
        ],
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )
    with pytest.raises(
        ConfigError, match="--zk-tls-key / DISCOVERY_ZK_TLS_KEY: the key is encrypted"
    ):
        ZkConfig(HOSTS, tls=True, tls_cert=str(pki.client_cert), tls_key=str(encrypted))


def test_clients_verify_the_chain_and_the_host_name(pki: DevPki) -> None:
    config = ZkConfig(
        HOSTS,
        tls=True,
        tls_ca=str(pki.ca_cert),
        tls_cert=str(pki.client_cert),
        tls_key=str(pki.client_key),
    )
    client = client_factory(config, AclIdentity.from_auth(None))()
    try:
        assert client.use_ssl is True
        assert client.verify_certs is True
        # kazoo's default is not to check it: any certificate of the CA would do.
        assert client.check_hostname is True
        assert (client.ca, client.certfile, client.keyfile) == (
            str(pki.ca_cert),
            str(pki.client_cert),
            str(pki.client_key),
        )
        # What a second client (closing an abandoned session) is made with.
        assert KazooTls.of(client) == KazooTls.from_config(config)
    finally:
        client.close()


def test_the_commands_refuse_a_file_without_zk_tls(
    pki: DevPki, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["status"], ["maint", "list"], ["fence", "check"], ["zk-exporter"]):
        code = discovery_main([*command, "--zk-tls-ca", str(pki.ca_cert)])
        assert code == 2, command
        assert "--zk-tls-ca / DISCOVERY_ZK_TLS_CA needs --zk-tls" in capsys.readouterr().err


def test_zk_init_takes_the_tls_flags(pki: DevPki, capsys: pytest.CaptureFixture[str]) -> None:
    # zk-init builds a ZkConfig of its own (the admin identity, no chroot): the TLS
    # settings must reach it, and be checked as everywhere else.
    secrets = ["--admin-auth", "admin:a", "--data-identities", "data:d"]
    secrets += ["--search-identities", "search:s"]
    code = discovery_main(["zk-init", "--zk", HOSTS, *secrets, "--zk-tls-ca", str(pki.ca_cert)])
    assert code == 2
    assert "--zk-tls-ca / DISCOVERY_ZK_TLS_CA needs --zk-tls" in capsys.readouterr().err
