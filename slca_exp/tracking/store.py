"""Opening an MLflow store that many processes open and write at once.

MLflow creates and migrates a fresh sqlite store in the first process that opens it, with no
lock: several runs started together on a new ``tracking.root`` migrate it at the same time and
fail (``duplicate column name``, ``table experiments already exists``, alembic's ``expected to
match one row``), and may leave it half-migrated, so that nobody can open it again. Creating the
same new experiment from several processes races as well. Here:

    open_client(uri):      lock <db>.lock -> MlflowClient (creates/migrates the schema) -> unlock
    get-or-create:         under the same lock (sqlite); for a server, the loser reads the winner's
    writes (retry_locked): "database is locked" -> wait 50 ms, 100 ms, ... -> give up after
                           LOCKED_RETRY_S; the tracker then spools the step (``tracking.spool``)

A server URI (``http://...``) needs no lock: the server serialises its own store.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import unquote

from filelock import FileLock

if TYPE_CHECKING:
    from mlflow import MlflowClient

T = TypeVar("T")

LOCKED_RETRY_S = 10.0
"""How long one write keeps retrying a locked sqlite database before its caller falls back.

MLflow already waits up to 20 s inside each attempt (its ``busy_timeout``); SQLite answers
"locked" at once, without waiting, when waiting could deadlock, which is what these retries
are for.
"""
FIRST_WAIT_S = 0.05
MAX_WAIT_S = 1.0
_LOCKED = ("database is locked", "database table is locked", "database is busy")


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI; ``None`` for any other store.

    Example:
        >>> sqlite_file("sqlite:////runs/mlflow.db").as_posix(), sqlite_file("http://h:5000")
        ('/runs/mlflow.db', None)

    """
    if not uri.startswith("sqlite:///"):
        return None  # also sqlite:// (in memory): nothing on disk to share
    # sqlite:////abs/mlflow.db is absolute, sqlite:///rel.db relative to the working folder.
    return Path(unquote(uri[len("sqlite:///") :].split("?", 1)[0]))


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Serialise a block against other processes using the same sqlite store (no-op otherwise)."""
    db = sqlite_file(uri)
    with FileLock(f"{db}.lock") if db is not None else nullcontext():
        yield


def open_client(uri: str) -> MlflowClient:
    """An ``MlflowClient`` on ``uri``, the store created or migrated by one process at a time.

    MLflow opens (and for a new file creates and migrates) the store when the client is built;
    the lock makes every other process wait until that is done and then find a complete schema.
    """
    from mlflow import MlflowClient

    db = sqlite_file(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    with store_lock(uri):
        return retry_locked(lambda: MlflowClient(tracking_uri=uri))


def is_locked(err: BaseException) -> bool:
    """Whether ``err`` (or an exception it was raised from) is SQLite's "database is locked"."""
    seen: BaseException | None = err
    while seen is not None:
        if any(text in str(seen).lower() for text in _LOCKED):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def retry_locked(
    call: Callable[[], T],
    *,
    budget_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``call()``, tried again with growing waits while it fails with a locked database.

    Safe for MLflow writes: a failed attempt rolled its transaction back, and a metric row
    written twice (same key, step, timestamp and value) is stored once.

    Args:
        call: the write.
        budget_s: no new attempt once this long has passed since the first (default
            :data:`LOCKED_RETRY_S`); an attempt itself may wait for MLflow's busy timeout.
        sleep: the wait (tests pass a fake one, with a fake ``clock``).
        clock: monotonic seconds.

    Raises:
        Exception: the last error once ``budget_s`` has passed, or at once any error that is
            not a locked database.

    """
    budget_s = LOCKED_RETRY_S if budget_s is None else budget_s
    deadline = clock() + budget_s
    wait = FIRST_WAIT_S
    while True:
        try:
            return call()
        except Exception as err:
            left = deadline - clock()
            if not is_locked(err) or left <= 0:
                raise
        # Jitter, so that writers that collided once do not collide again in step.
        sleep(min(wait * random.uniform(0.5, 1.5), left))
        wait = min(wait * 2, MAX_WAIT_S)
