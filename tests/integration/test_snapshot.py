"""Index snapshots (``data_server/snapshot.py``): a restart loads the shard it built,
never another's, never a torn one, never from a directory others may write to."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from data_server.corpus import generate_documents, sample_queries
from data_server.index import InvertedIndex
from data_server.snapshot import IndexSnapshots, SnapshotKey
from tests.support import DataServerFactory, sample


@pytest.fixture(scope="module")
def index() -> InvertedIndex:
    return InvertedIndex(generate_documents(300, shard=2, seed=5))


def _key(**changes: object) -> SnapshotKey:
    fields: dict[str, object] = {"shard": 2, "seed": 5, "docs": 300, "version": "1.0"}
    fields.update(changes)
    return SnapshotKey.generated(**fields)  # type: ignore[arg-type]


def test_a_saved_index_loads_back_and_answers_the_same(
    tmp_path: Path, index: InvertedIndex
) -> None:
    snapshots = IndexSnapshots(tmp_path / "snap")
    assert snapshots.load(_key()) is None
    snapshots.save(_key(), index)
    loaded = IndexSnapshots(tmp_path / "snap").load(_key())
    assert loaded is not None
    assert loaded.document_count == index.document_count
    for query in sample_queries(10, variant=3):
        assert loaded.search(query, 10) == index.search(query, 10)
    # Nothing but the snapshot is left in the directory (no temporary file).
    assert [p.name for p in (tmp_path / "snap").iterdir()] == [_key().name()]
    assert (tmp_path / "snap").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    "other",
    [_key(shard=3), _key(seed=6), _key(docs=301), _key(version="1.1")],
    ids=["shard", "seed", "docs", "version"],
)
def test_a_snapshot_of_other_documents_or_another_version_is_not_used(
    tmp_path: Path, index: InvertedIndex, other: SnapshotKey
) -> None:
    snapshots = IndexSnapshots(tmp_path)
    snapshots.save(_key(), index)
    assert snapshots.load(other) is None


def test_a_docs_file_key_changes_with_the_file(tmp_path: Path) -> None:
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "text": "x"}\n')
    first = SnapshotKey.from_file(docs, shard=0, version="1")
    docs.write_text('{"id": "a", "text": "x y"}\n')
    os.utime(docs, ns=(1, 1))
    assert SnapshotKey.from_file(docs, shard=0, version="1") != first


def test_a_damaged_snapshot_costs_a_build_not_a_wrong_index(
    tmp_path: Path, index: InvertedIndex, caplog: pytest.LogCaptureFixture
) -> None:
    snapshots = IndexSnapshots(tmp_path)
    snapshots.save(_key(), index)
    path = tmp_path / _key().name()
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # a flipped byte in the payload
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="data_server.snapshot"):
        assert snapshots.load(_key()) is None
    assert "damaged" in caplog.text
    path.write_bytes(bytes(data[:100]))  # torn
    assert snapshots.load(_key()) is None
    path.write_bytes(b"not a snapshot")
    assert snapshots.load(_key()) is None


def test_a_directory_others_may_write_to_is_not_trusted(
    tmp_path: Path, index: InvertedIndex, caplog: pytest.LogCaptureFixture
) -> None:
    IndexSnapshots(tmp_path / "shared").save(_key(), index)
    (tmp_path / "shared").chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="data_server.snapshot"):
        assert IndexSnapshots(tmp_path / "shared").load(_key()) is None
    assert "others may write" in caplog.text


def test_a_directory_that_cannot_be_made_turns_snapshots_off(
    tmp_path: Path, index: InvertedIndex
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    snapshots = IndexSnapshots(blocker / "snap")
    snapshots.save(_key(), index)  # logged, not raised
    assert snapshots.load(_key()) is None


async def test_a_restarted_data_server_loads_its_index_from_the_snapshot(
    make_data_server: DataServerFactory, tmp_path: Path
) -> None:
    snapshots = tmp_path / "index"
    first = await make_data_server(shard=4, docs=200, index_snapshot_dir=snapshots)
    assert sample(first.registry, "data_server_index_from_snapshot") == 0
    assert len(list(snapshots.iterdir())) == 1
    # The restart (another server of the same shard and documents here): loaded, and
    # answering exactly as the one that built it.
    second = await make_data_server(shard=4, docs=200, index_snapshot_dir=snapshots)
    assert sample(second.registry, "data_server_index_from_snapshot") == 1
    assert first.index is not None
    assert second.index is not None
    for query in sample_queries(5, variant=9):
        assert second.index.search(query, 10) == first.index.search(query, 10)
    # Other documents are built, not loaded.
    third = await make_data_server(shard=4, docs=201, index_snapshot_dir=snapshots)
    assert sample(third.registry, "data_server_index_from_snapshot") == 0
