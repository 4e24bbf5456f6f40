"""Cross-process file locks: one process at a time creates what many jobs share.

Jobs of a sweep, or runs started together by hand, share a tracking store, a generated synthetic
split, the tiny backbone, SFT weights and the judge/simulator cache. The first use of each is a
check-then-create, and two processes doing it at the same moment either fail (the MLflow schema
migrating twice) or waste the work. Each such place takes :func:`file_lock` on a lock file beside
the thing it creates, checks again under the lock, and creates it only if it is still missing:

    lock <artifact>.lock -> still missing? -> build aside -> rename into place -> unlock

The lock is ``fcntl.flock`` on an open file: the kernel drops it when the holder exits, however it
exits, so a killed job never leaves a stale lock. Lock files are left in place on purpose:
deleting one while another process waits on it would let a third process lock a new file of the
same name. ``flock`` is reliable on local filesystems; over NFS, Lustre or GPFS it depends on the
mount (see ``slca_exp.launch.profiles.network_store_problems``).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

POLL_S = 0.05
"""How often a waiter with a timeout tries the lock again."""


class LockTimeout(TimeoutError):
    """Another process held a lock longer than the caller was willing to wait."""


def lock_path(target: str | Path) -> Path:
    """The lock file guarding ``target``: ``<target>.lock`` beside it.

    Example:
        >>> lock_path("/data/out/mlflow.db").as_posix()
        '/data/out/mlflow.db.lock'

    """
    target = Path(target)
    return target.with_name(f"{target.name}.lock")


@contextmanager
def file_lock(path: str | Path, *, timeout_s: float | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created with its folder) for the ``with`` block.

    Args:
        path: the lock file, usually :func:`lock_path` of what it guards.
        timeout_s: give up after this long; ``None`` waits as long as the holder needs.

    Raises:
        LockTimeout: ``timeout_s`` passed while another process held the lock.

    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # "a" never truncates: the file is shared, its content is irrelevant.
    with path.open("a") as handle:
        _acquire(handle.fileno(), path, timeout_s)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _acquire(fd: int, path: Path, timeout_s: float | None) -> None:
    if timeout_s is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"{path} is still locked by another process after {timeout_s:g} s "
                    f"(pid {os.getpid()} waited); the lock is released when that process ends"
                ) from None
            time.sleep(POLL_S)
