"""The image's wheelhouse (deploy/docker/wheelhouse.py) and make compose-check's verdicts.

The wheelhouse is downloaded on the host for another interpreter (Debian bookworm's
Python 3.11.2 in the image); ``pip download`` evaluates environment markers against the
host's, so the wheelhouse completes the closure against the image's markers itself.
These tests build wheels' metadata by hand and check that closure; no index is used.
"""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import REPO_ROOT

ROOT = REPO_ROOT


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


wheelhouse = _load("wheelhouse", ROOT / "deploy/docker/wheelhouse.py")
compose_check = _load("compose_check", ROOT / "deploy/compose_check.py")


def _env(python: str) -> dict[str, str]:
    return {
        "implementation_name": "cpython",
        "implementation_version": python,
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_release": "6.1.0",
        "platform_system": "Linux",
        "platform_version": "#1 SMP",
        "python_full_version": python,
        "platform_python_implementation": "CPython",
        "python_version": ".".join(python.split(".")[:2]),
        "sys_platform": "linux",
    }


def _wheel(dest: Path, name: str, version: str, *requires: str) -> Path:
    path = dest / f"{name}-{version}-py3-none-any.whl"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(metadata) + "\n")
    return path


REDIS_REQUIRES = (
    "async-timeout>=4.0.3; python_full_version < '3.11.3'",
    "hiredis>=3.2.0; extra == 'hiredis'",
)


def test_a_requirement_only_the_images_python_needs_is_found_missing(tmp_path: Path) -> None:
    _wheel(tmp_path, "redis", "8.1.0", *REDIS_REQUIRES)
    # Debian bookworm's 3.11.2 needs async-timeout; a 3.11.7 host does not; extras never.
    assert wheelhouse.missing_for_target(tmp_path, _env("3.11.2")) == ["async-timeout>=4.0.3"]
    assert wheelhouse.missing_for_target(tmp_path, _env("3.11.7")) == []


def test_a_wheel_present_in_a_matching_version_satisfies_it(tmp_path: Path) -> None:
    _wheel(tmp_path, "redis", "8.1.0", *REDIS_REQUIRES)
    _wheel(tmp_path, "async_timeout", "4.0.2")
    assert wheelhouse.missing_for_target(tmp_path, _env("3.11.2")) == ["async-timeout>=4.0.3"]
    _wheel(tmp_path, "async_timeout", "5.0.1")
    assert wheelhouse.missing_for_target(tmp_path, _env("3.11.2")) == []


def test_prune_keeps_the_newest_wheel_of_each_package(tmp_path: Path) -> None:
    old = _wheel(tmp_path, "async_timeout", "4.0.2")
    new = _wheel(tmp_path, "async_timeout", "5.0.1")
    other = _wheel(tmp_path, "kazoo", "2.11.0")
    wheelhouse.prune(tmp_path)
    assert not old.exists()
    assert new.exists()
    assert other.exists()


VIEWS = {
    "search-1": {"leader": "search-1", "epoch": 7, "serving": 100, "listed": 100},
    "search-2": {"leader": "search-1", "epoch": 7, "serving": 100, "listed": 100},
}


def test_all_serving_needs_every_search_server_to_list_and_serve_all() -> None:
    assert compose_check.all_serving(VIEWS, 100)[0]
    lagging = {
        **VIEWS,
        "search-3": {"leader": "search-1", "epoch": 7, "serving": 99, "listed": 100},
    }
    assert not compose_check.all_serving(lagging, 100)[0]
    unreachable = {**VIEWS, "search-3": {"error": "connection refused"}}
    assert not compose_check.all_serving(unreachable, 100)[0]


@pytest.mark.parametrize(
    ("views", "done"),
    [
        ({"a": {"leader": "search-2", "epoch": 9}, "b": {"leader": "search-2", "epoch": 9}}, True),
        # Not yet: the old leader, its epoch, a disagreement, nobody.
        ({"a": {"leader": "search-1", "epoch": 7}, "b": {"leader": "search-1", "epoch": 7}}, False),
        ({"a": {"leader": "search-2", "epoch": 7}, "b": {"leader": "search-2", "epoch": 7}}, False),
        ({"a": {"leader": "search-2", "epoch": 9}, "b": {"leader": "search-3", "epoch": 9}}, False),
        ({"a": {"leader": None, "epoch": 9}, "b": {"leader": None, "epoch": 9}}, False),
        # A view without an epoch (a server still loading): not yet, and no TypeError.
        ({"a": {"leader": "search-2"}, "b": {"leader": "search-2"}}, False),
    ],
)
def test_a_new_leader_needs_agreement_and_a_higher_epoch(views: dict, done: bool) -> None:
    assert compose_check.agreed_new_leader(views, "search-1", 7)[0] is done
