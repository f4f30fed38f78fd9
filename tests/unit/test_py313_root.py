"""deploy/py313/root.sh deletes only roots it made: ``remove``, run unprivileged on
directories of our own (never ``ensure`` or ``run``, which debootstrap a root)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

SCRIPT = REPO_ROOT / "deploy" / "py313" / "root.sh"
MARKER = ".search-discovery-root"


def _remove(root: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DEBIAN_MIRROR"}
    env["PY313_ROOT"] = str(root)
    return subprocess.run(
        ["bash", str(SCRIPT), "remove"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_remove_refuses_a_directory_it_did_not_make(tmp_path: Path) -> None:
    root = tmp_path / "srv"
    (root / "data").mkdir(parents=True)
    (root / "data" / "precious").write_text("keep me\n")
    done = _remove(root)
    assert done.returncode != 0
    assert f"PY313_ROOT={root}" in done.stderr
    assert MARKER in done.stderr
    assert (root / "data" / "precious").read_text() == "keep me\n"


def test_remove_refuses_a_leftover_new_root_it_did_not_make(tmp_path: Path) -> None:
    root = tmp_path / "root"
    new = tmp_path / "root.new"
    new.mkdir()
    (new / "precious").write_text("keep me\n")
    done = _remove(root)
    assert done.returncode != 0
    assert f"PY313_ROOT={root}" in done.stderr
    assert (new / "precious").is_file()


@pytest.mark.parametrize("leftover", [False, True], ids=["root", "root-and-new"])
def test_remove_deletes_a_root_with_its_marker(tmp_path: Path, leftover: bool) -> None:
    root = tmp_path / "root"
    (root / "opt" / "venv").mkdir(parents=True)
    (root / MARKER).write_text("made by root.sh\n")
    (root / "opt" / "venv" / "file").write_text("x\n")
    new = tmp_path / "root.new"
    if leftover:
        new.mkdir()
        (new / MARKER).write_text("made by root.sh\n")
    done = _remove(root)
    assert done.returncode == 0, done.stderr
    assert not root.exists()
    assert not new.exists()


def test_remove_of_nothing_or_an_empty_directory_is_fine(tmp_path: Path) -> None:
    assert _remove(tmp_path / "absent").returncode == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _remove(empty)
    assert done.returncode == 0, done.stderr
    assert not empty.exists()
