"""Index snapshots: a restarted data server loads its shard instead of building it.

A snapshot can cost a rebuild, never a wrong index: one with another key, a bad digest
or in a directory others may write to is not used. Nothing raises into the data
server's start-up; each problem is logged once and costs a build.

Design: docs/design/overload.md, "A restart does not starve the servers answering".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from .index import InvertedIndex

__all__ = ["IndexSnapshots", "SnapshotKey"]

log = logging.getLogger(__name__)

_MAGIC = b"DSIDX1\n"
_DIGEST = hashlib.sha256().digest_size


@dataclass(frozen=True)
class SnapshotKey:
    """What an index was built from: a snapshot is used only for the same key."""

    shard: int
    version: str
    seed: int | None = None
    docs: int | None = None
    docs_file: str | None = None
    docs_file_size: int | None = None
    docs_file_mtime_ns: int | None = None

    @classmethod
    def generated(cls, *, shard: int, seed: int, docs: int, version: str) -> SnapshotKey:
        return cls(shard=shard, version=version, seed=seed, docs=docs)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, shard: int, version: str) -> SnapshotKey:
        """The key of documents loaded from ``path`` (its size and modification time
        stand for its content). Raises ``OSError`` if it cannot be read."""
        info = os.stat(path)
        return cls(
            shard=shard,
            version=version,
            docs_file=os.fsdecode(os.path.abspath(path)),
            docs_file_size=info.st_size,
            docs_file_mtime_ns=info.st_mtime_ns,
        )

    def name(self) -> str:
        """The snapshot's file name: the shard and a digest of the whole key."""
        digest = hashlib.sha256(self.encoded()).hexdigest()[:16]
        return f"shard-{self.shard}-{digest}.idx"

    def encoded(self) -> bytes:
        """The whole key as bytes (canonical JSON): a snapshot's header, checked on load."""
        return json.dumps(asdict(self), sort_keys=True).encode()


class IndexSnapshots:
    """The snapshots in ``directory`` (made if missing, mode 0700)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._usable: bool | None = None

    def load(self, key: SnapshotKey) -> InvertedIndex | None:
        """The index saved under ``key``, or None: none saved, another key, a torn or
        unreadable file, or a directory that cannot be trusted (each logged)."""
        if not self._check_directory():
            return None
        path = self.directory / key.name()
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("index snapshot %s cannot be read (%s): building the index", path, exc)
            return None
        index = self._decode(data, key, path)
        if index is not None:
            log.info("shard %d: index loaded from its snapshot %s", key.shard, path)
        return index

    def save(self, key: SnapshotKey, index: InvertedIndex) -> None:
        """Save ``index`` under ``key``, atomically; a failure is logged, never raised."""
        if not self._check_directory():
            return
        payload = pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL)
        header = key.encoded()
        data = b"".join(
            (
                _MAGIC,
                len(header).to_bytes(4, "big"),
                header,
                hashlib.sha256(payload).digest(),
                payload,
            )
        )
        path = self.directory / key.name()
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".idx")
            try:
                with os.fdopen(fd, "wb") as stream:
                    stream.write(data)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            log.warning("index snapshot %s not written (%s)", path, exc)

    def _decode(self, data: bytes, key: SnapshotKey, path: Path) -> InvertedIndex | None:
        expected = key.encoded()
        start = len(_MAGIC) + 4
        if not data.startswith(_MAGIC) or len(data) < start:
            log.warning("index snapshot %s is not one: building the index", path)
            return None
        size = int.from_bytes(data[len(_MAGIC) : start], "big")
        header = data[start : start + size]
        digest = data[start + size : start + size + _DIGEST]
        payload = data[start + size + _DIGEST :]
        if header != expected:
            # Another build's (a new version, other documents) under a colliding name.
            return None
        if hashlib.sha256(payload).digest() != digest:
            log.warning("index snapshot %s is damaged (digest): building the index", path)
            return None
        try:
            # Our own file, in a directory only we may write to (see _trusted).
            index = pickle.loads(payload)
        except Exception as exc:  # any unpickling failure costs a build, not the start
            log.warning("index snapshot %s cannot be loaded (%s): building it", path, exc)
            return None
        if not isinstance(index, InvertedIndex):
            log.warning("index snapshot %s holds no index: building it", path)
            return None
        return index

    def _check_directory(self) -> bool:
        """Made and trusted (ours, not writable by others), checked once."""
        if self._usable is None:
            self._usable = self._trusted()
        return self._usable

    def _trusted(self) -> bool:
        directory = self.directory
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = directory.stat()
        except OSError as exc:
            log.warning("index snapshots off: %s cannot be made (%s)", directory, exc)
            return False
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            # Unpickling runs code the file names: only a directory nobody else can
            # write to is safe to load from.
            log.warning(
                "index snapshots off: %s is not this user's own or others may write to it",
                directory,
            )
            return False
        return True
