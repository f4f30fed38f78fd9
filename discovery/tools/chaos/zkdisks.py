"""Each ZooKeeper server's data disk in a chaos run: a small tmpfs of its own, to fill.

Blocking (``mount`` and ``umount`` processes): call in a thread. Where the harness may not
mount, there are no disks (logged) and the disk faults are skipped; an unmount that fails is
logged and the rest are unmounted all the same.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

__all__ = ["ZK_DISK_MB", "ZK_PRE_ALLOC_KB", "mount_zk_disks", "unmount_zk_disks"]

log = logging.getLogger(__name__)

#: Each ZooKeeper server's tmpfs. Its snapshots and logs grow some 50 KB a minute in a
#: run (a snapshot and a new log at every election: 0.9 MB after 18 minutes of a
#: soak), purged hourly (:mod:`discovery.testing.zookeeper`): a few MB at most.
ZK_DISK_MB = 16
#: ``preAllocSize`` on those disks (KiB): the log grows 4 KiB at a time, so a full disk
#: refuses a write within a few kilobytes of transactions.
ZK_PRE_ALLOC_KB = 4


def mount_zk_disks(root: Path, servers: int) -> list[Path]:
    """A tmpfs per ZooKeeper server under ``root``; none (logged) where mounting is refused."""
    disks = [root / f"zk{i + 1}" for i in range(servers)]
    mounted: list[Path] = []
    try:
        for disk in disks:
            disk.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={ZK_DISK_MB}m", "tmpfs", str(disk)],
                check=True,
                capture_output=True,
                text=True,
            )
            mounted.append(disk)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else exc
        log.warning("no tmpfs for ZooKeeper's data (%s): the disk faults are skipped", detail)
        for disk in mounted:
            subprocess.run(["umount", str(disk)], check=False, capture_output=True)
        return []
    return disks


def unmount_zk_disks(disks: list[Path]) -> None:
    """Unmount every disk of :func:`mount_zk_disks`."""
    for disk in disks:
        result = subprocess.run(["umount", str(disk)], check=False, capture_output=True)
        if result.returncode != 0:
            log.warning("could not unmount %s: %s", disk, result.stderr.decode().strip())
