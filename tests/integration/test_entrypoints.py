"""The console entry points: settings from flags and environment, and a real process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from data_server import cli as data_server_cli
from discovery.instance import ServiceInstance
from discovery.tools import main as discovery_cli
from discovery.zk.paths import DATA_SERVERS_PATH
from search_server import cli as search_server_cli
from tests.support import DataServerFactory, SessionFactory, eventually, reap, waited


@pytest.mark.parametrize(
    "main", [data_server_cli.main, search_server_cli.main], ids=["data-server", "search-server"]
)
def test_help_documents_every_setting_with_its_variable(
    main: object, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])  # type: ignore[operator]
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for flag, env in [
        ("--zk", "DISCOVERY_ZK_HOSTS"),
        ("--redis", "DISCOVERY_REDIS_URL"),
        ("--cluster", "DISCOVERY_CLUSTER"),
        ("--session-timeout", "DISCOVERY_SESSION_TIMEOUT"),
        ("--admin-token", "DISCOVERY_ADMIN_TOKEN"),
        ("--host", "DISCOVERY_HOST"),
        ("--port", "DISCOVERY_PORT"),
        ("--id", "DISCOVERY_ID"),
    ]:
        assert flag in out
        assert f"env {env}" in out


def test_bad_flag_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        data_server_cli.main(["--session-timeout", "-1"])
    assert exited.value.code == 2
    assert "--session-timeout" in capsys.readouterr().err


def test_bad_environment_value_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DISCOVERY_SESSION_TIMEOUT", "soon")
    with pytest.raises(SystemExit) as exited:
        data_server_cli.main([])
    assert exited.value.code == 2
    assert "DISCOVERY_SESSION_TIMEOUT='soon'" in capsys.readouterr().err


def test_bad_instance_id_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        data_server_cli.main(["--id", "no/slashes"])
    assert exited.value.code == 2
    assert "--id" in capsys.readouterr().err


def test_discovery_command_lists_its_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        discovery_cli.main(["--help"])
    out = capsys.readouterr().out
    assert "devcluster" in out
    assert "demo" in out


async def test_data_server_process_registers_when_listening_and_leaves_on_sigterm(
    zk_hosts: str, make_session: SessionFactory
) -> None:
    observer = await make_session()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "data_server.cli",
        *("--zk", zk_hosts, "--port", "0", "--id", "ds-proc", "--shard", "4"),
        *("--session-timeout", "2", "--log-level", "WARNING"),
    )
    path = f"{DATA_SERVERS_PATH}/ds-proc"
    try:
        await eventually(lambda: observer.exists(path), timeout=30, message="registered")
        data, _ = await observer.get(path)
        instance = ServiceInstance.from_json(data)
        assert (instance.id, instance.payload.shard, instance.address) == (
            "ds-proc",
            4,
            "127.0.0.1",
        )
        # Registered only once listening: the advertised port answers.
        _, writer = await asyncio.open_connection(instance.address, instance.port)
        writer.close()
        await writer.wait_closed()

        process.send_signal(signal.SIGTERM)
        assert await waited(process.wait(), "ds-proc to exit after SIGTERM", timeout=20) == 0
        # Deregistered explicitly, not left to the session timeout.
        assert await observer.exists(path) is None
    finally:
        await reap(process)


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_demo_plays_the_whole_scenario_at_small_scale(tmp_path: Path) -> None:
    # What `make demo` runs, with 12 data servers instead of 100: every phase must
    # reach its expected state, or the exit code is 1.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISCOVERY_")}
    demo = subprocess.Popen(
        [
            *(sys.executable, "-m", "discovery.tools.main", "--log-level", "WARNING"),
            *("demo", "--nodes", "12", "--rate", "10"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = demo.communicate(timeout=780)
    except subprocess.TimeoutExpired:
        # Ctrl-C lets the demo stop its servers; whatever is left goes with the group.
        demo.send_signal(signal.SIGINT)
        try:
            stdout, stderr = demo.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            stdout, stderr = demo.communicate()
        pytest.fail("the demo did not finish in 13 minutes:\n" + stdout[-4000:])
    assert demo.returncode == 0, stdout[-4000:] + stderr[-3000:]
    for phase in ("1. start", "2. crash", "3. slow down", "4. drain", "5. kill the leader"):
        assert phase in stdout
    assert "FAILED" not in stdout


def test_bad_docs_file_line_is_reported_naming_the_flag(tmp_path: Path) -> None:
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "text": "fine"}\n{"id": 7, "text": "bad id"}\n')
    result = subprocess.run(
        [sys.executable, "-m", "data_server.cli", "--docs-file", str(docs), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "--docs-file" in result.stderr
    assert "line 2" in result.stderr


async def test_docs_file_documents_are_searchable(
    tmp_path: Path, make_data_server: DataServerFactory
) -> None:
    docs = tmp_path / "docs.jsonl"
    docs.write_text(
        "\n".join(
            json.dumps(doc)
            for doc in [
                {"id": "d1", "title": "Zookeeper", "text": "ephemeral nodes vanish"},
                {"id": "d2", "title": "Redis", "text": "a live list in one key"},
                {"id": "d3", "text": "nodes and keys and lists"},
            ]
        )
        + "\n"
    )
    server = await make_data_server(docs_file=docs)
    async with (
        aiohttp.ClientSession() as client,
        client.get(f"{server.url}/search", params={"q": "ephemeral nodes"}) as response,
    ):
        body = await response.json()
    assert [hit["id"] for hit in body["hits"]] == ["d1", "d3"]
    assert server.agent is not None
    assert server.agent.instance.payload.docs == 3
