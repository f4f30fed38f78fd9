"""The installable package: ``python -m build`` makes a wheel and an sdist, and the wheel
installed into an empty virtual environment gives working ``discovery``,
``data-server`` and ``search-server`` commands — run for real here, from that
environment, against this test's ZooKeeper and Redis, not from the source tree.

Installing the wheel fetches its dependencies from the package index (the machine's
only network), as a user's ``pip install`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tomllib
import venv
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from discovery.testing import RedisServer, free_port
from tests.support import REPO_ROOT, cluster_of, eventually, reap, shard_counts

ROOT = REPO_ROOT
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _shared(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A directory of this run that every pytest-xdist worker sees (the workers' base
    temporary directories are subdirectories of the run's)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    path = base / name
    path.mkdir(exist_ok=True)
    return path


@contextlib.contextmanager
def _once(shared: Path, what: str) -> Iterator[bool]:
    """Hold ``shared``'s lock for ``what``; yield whether it still has to be made (the
    caller makes it, and it counts as made if the block ends without an error)."""
    done = shared / f"{what}.done"
    with (shared / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            todo = not done.exists()
            yield todo
            if todo:
                done.touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel and sdist of this tree, built once for the run: with parallel workers
    the first that needs them builds them and the others wait, since two builds at once
    write the same egg-info in the source tree (one failed with ENOENT)."""
    shared = _shared(tmp_path_factory, "package")
    out = shared / "dist"
    with _once(shared, "dist") as todo:
        if todo:
            shutil.rmtree(out, ignore_errors=True)
            result = subprocess.run(
                [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty venv with only the wheel (and its dependencies) installed: its bin dir.
    Made once for the run, as ``dist`` is; the tests only run its commands."""
    shared = _shared(tmp_path_factory, "package")
    env_dir = shared / "venv"
    with _once(shared, "venv") as todo:
        if todo:
            venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
            wheel = next(dist.glob("*.whl"))
            result = subprocess.run(
                [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return env_dir / "bin"


def _run(bin_dir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    # cwd outside the source tree: nothing may be imported from it.
    return subprocess.run(
        [str(bin_dir / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=bin_dir.parent,
    )


def test_build_makes_a_wheel_and_an_sdist_of_the_version_in_pyproject(dist: Path) -> None:
    names = sorted(p.name for p in dist.iterdir())
    assert names == [
        f"search_discovery-{VERSION}-py3-none-any.whl",
        f"search_discovery-{VERSION}.tar.gz",
    ]


def test_the_installed_commands_report_one_version(installed: Path) -> None:
    for command in ("discovery", "data-server", "search-server"):
        result = _run(installed, command, "--version")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"{command} {VERSION}"
    result = _run(installed, "python", "-c", "import discovery; print(discovery.__file__)")
    assert result.stdout.strip().startswith(str(installed.parent)), result.stdout
    for argv in (("discovery", "maint", "--help"), ("discovery", "status", "--help")):
        result = _run(installed, *argv)
        assert result.returncode == 0, result.stderr


def test_the_dashboard_page_and_type_marker_are_installed(installed: Path) -> None:
    script = (
        "from importlib import resources;"
        "print(len(resources.files('search_server').joinpath('dashboard.html').read_text()));"
        "print(resources.files('discovery').joinpath('py.typed').is_file())"
    )
    result = _run(installed, "python", "-c", script)
    assert result.returncode == 0, result.stderr
    length, typed = result.stdout.split()
    assert int(length) > 1000
    assert typed == "True"


@pytest.mark.smoke
async def test_installed_servers_register_lead_and_answer_a_query(
    installed: Path, zk_hosts: str, redis_server: RedisServer, redis_prefix: str
) -> None:
    cluster = cluster_of(redis_prefix)
    search_port, data_port = free_port(), free_port()
    common = ("--zk", zk_hosts, "--redis", redis_server.url, "--cluster", cluster)
    search = await asyncio.create_subprocess_exec(
        str(installed / "search-server"),
        *common,
        *("--id", "ss-wheel", "--port", str(search_port), "--log-level", "WARNING"),
        cwd=installed.parent,
    )
    data = await asyncio.create_subprocess_exec(
        str(installed / "data-server"),
        *common,
        *("--id", "ds-wheel", "--port", str(data_port), "--shard", "0", "--docs", "200"),
        *("--log-level", "WARNING"),
        cwd=installed.parent,
    )
    try:
        async with aiohttp.ClientSession() as client:

            async def answers() -> bool:
                try:
                    async with client.get(
                        f"http://127.0.0.1:{search_port}/search", params={"q": "a", "k": "3"}
                    ) as response:
                        if response.status != 200:
                            return False
                        body = await response.json()
                except aiohttp.ClientError:
                    return False
                return bool(body["shards"] == shard_counts(1, 1))

            await eventually(answers, timeout=60, message="the installed cluster answers")
            status = _run(installed, "discovery", "status", "--zk", zk_hosts, *common[2:])
            assert status.returncode == 0, status.stdout + status.stderr
            assert "ds-wheel" in status.stdout
            assert "ss-wheel" in status.stdout
    finally:
        await reap(search)
        await reap(data)
