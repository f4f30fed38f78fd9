"""kazoo's internals behind one door: the import-time check, and that nothing else
reaches past it. Pure: no ZooKeeper (kazoo's constructor opens no socket)."""

from __future__ import annotations

import ast
import re
from importlib.metadata import version
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.connection import ConnectionHandler

import discovery
from discovery.errors import DiscoveryError, KazooIncompatibleError
from discovery.zk import _kazoo
from tests.support import REPO_ROOT

ROOT = REPO_ROOT
# Private names of kazoo's objects we use; each must be reached through _kazoo only.
PRIVATE = re.compile(
    r"\.(_call|_connection|_session_timeout|_data_watchers|_child_watchers|_pending|_queue"
    r"|_stopped|_live|_state|_read_watch_event|_read_response|_prefix_root)\b"
)


def test_the_installed_kazoo_passes_the_check() -> None:
    _kazoo.check()
    _kazoo.check(KazooClient(hosts="127.0.0.1:2181"))


def test_a_kazoo_without_a_client_internal_fails_naming_its_version() -> None:
    client = KazooClient(hosts="127.0.0.1:2181")
    del client._pending  # as a kazoo release that renamed it would have it
    with pytest.raises(KazooIncompatibleError) as excinfo:
        _kazoo.check(client)
    message = str(excinfo.value)
    assert f"kazoo {version('kazoo')} lacks KazooClient()._pending" in message
    assert _kazoo.TESTED in message
    # One root for our errors, and an ImportError for whoever imports discovery.
    assert isinstance(excinfo.value, DiscoveryError)
    assert isinstance(excinfo.value, ImportError)


def test_a_kazoo_without_a_connection_reader_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(ConnectionHandler, "_read_response")
    with pytest.raises(KazooIncompatibleError, match=r"ConnectionHandler\._read_response"):
        _kazoo.check()


def test_the_package_bounds_kazoo_to_the_tested_range() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"kazoo{_kazoo.TESTED}"' in pyproject


def test_no_other_module_of_the_library_touches_kazoo_internals() -> None:
    offenders = []
    for path in sorted(Path(discovery.__file__).parent.rglob("*.py")):
        if path.name == "_kazoo.py":
            continue
        tree = ast.parse(path.read_text())
        # Code only: docstrings may name the internals they explain.
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and PRIVATE.fullmatch("." + node.attr):
                owner = ast.unparse(node.value)
                # An object's own private names: ours, not kazoo's.
                if not owner.startswith(("self", "cls")):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {owner}.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kazoo"):
                offenders += [
                    f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_")
                ]
    assert not offenders, "kazoo internals outside discovery/zk/_kazoo.py:\n" + "\n".join(offenders)
