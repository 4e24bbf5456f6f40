"""Cross-process file locks: one process at a time creates what many jobs share.

Jobs of a sweep share a tracking store, a generated split, the tiny backbone, SFT weights and
the service cache; the first use of each is a check-then-create. Each such place locks a file
beside what it creates (``filelock.FileLock(lock_path(target))``), checks again under the lock
and creates it only if it is still missing:

    lock <target>.lock -> still missing? -> build aside -> rename into place -> unlock

On Unix ``FileLock`` is ``fcntl.flock`` on an open file: the kernel drops it when the holder
exits, however it exits, so a lock file a killed job left behind blocks no one. The file stays
in place on release, so that waiters share one inode. Over NFS, Lustre or GPFS flock depends on
the mount (``slca_exp.launch.profiles.network_store_problems``).
"""

from __future__ import annotations

from pathlib import Path


def lock_path(target: str | Path) -> Path:
    """The lock file guarding ``target``: ``<target>.lock`` beside it.

    >>> lock_path("/data/out/mlflow.db").as_posix()
    '/data/out/mlflow.db.lock'
    """
    target = Path(target)
    return target.with_name(f"{target.name}.lock")
