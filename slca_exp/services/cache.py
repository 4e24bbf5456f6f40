"""A persistent answer cache shared by judges and simulators: one sqlite table, key -> JSON.

Key: a sha256 over everything that determines an answer: the kind of service, the model name, the
prompt template's sha256, temperature, max_tokens and the rendered messages
(``cached.CachedChat.key``; :func:`cache_key` hashes the canonical JSON of any other document).
The serving address (``base_url``) is deliberately NOT part of the key: moving the same model to
another host or port must not throw the cache away, so a model name has to identify its weights
(serve them under a versioned name). The API key is never part of a key or a value.

Only successful answers are stored; a failure is retried on the next call instead of being
replayed forever. An answer sampled at temperature > 0 is cached like any other: a re-run then
sees the same simulated world, which is what reproducibility needs.

Several processes may share one file: the database runs in WAL mode (readers never block the
writer) and every connection waits up to ``timeout_s`` for a lock instead of failing; opening
the file (creating it, switching it to WAL) is done by one process at a time, under
``<file>.lock``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock

CACHE_DIR_ENV = "SLCA_EXP_CACHE_DIR"
"""Env var naming the folder of the default cache file."""

CACHE_FILE = "services.sqlite"

# SQLite's historical limit on host parameters per statement is 999; stay well below it.
_CHUNK = 500


def default_cache_path() -> Path:
    """``$SLCA_EXP_CACHE_DIR/services.sqlite``, else ``~/.cache/slca-exp/services.sqlite``."""
    folder = os.environ.get(CACHE_DIR_ENV)
    base = Path(folder).expanduser() if folder else Path.home() / ".cache" / "slca-exp"
    return base / CACHE_FILE


def canonical_json(obj: Any) -> str:
    """Compact JSON with sorted keys: equal documents give equal strings.

    Non-finite floats are written as ``NaN``/``Infinity`` (Python's JSON extension) rather than
    rejected, so any decoded tool call can be keyed.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def cache_key(parts: Mapping[str, Any]) -> str:
    """The sha256 hex digest of the canonical JSON of ``parts``.

    >>> cache_key({"b": 1, "a": [1, 2]}) == cache_key({"a": [1, 2], "b": 1})
    True

    """
    data = canonical_json(parts).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


class ServiceCache:
    """A key -> JSON value store in one sqlite file.

    Args:
        path: the database file (created with its folder); default :func:`default_cache_path`.
        timeout_s: how long to wait for another process's lock before giving up.

    The connection is shared by the threads of one process behind a lock (judges call it from
    their event-loop thread and from the caller's thread).

    """

    def __init__(self, path: str | Path | None = None, *, timeout_s: float = 30.0) -> None:
        self.path = Path(path).expanduser() if path else default_cache_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # Switching a new file to WAL does not wait for other connections (SQLite answers
        # "database is locked" at once), so jobs opening a new cache together take turns.
        with FileLock(f"{self.path}.lock", timeout=timeout_s):
            self._conn: sqlite3.Connection | None = sqlite3.connect(
                str(self.path), timeout=timeout_s, check_same_thread=False, isolation_level=None
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL is durable across application crashes in WAL mode; a power cut may drop
            # the last answers, which only costs a recomputation.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )

    def __repr__(self) -> str:
        return f"ServiceCache({str(self.path)!r})"

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        """Values of the ``keys`` that are stored (missing keys are absent from the result)."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, Any] = {}
        if not wanted:
            return found
        with self._lock:
            conn = self._connection()
            for i in range(0, len(wanted), _CHUNK):
                chunk = wanted[i : i + _CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    f"SELECT key, value FROM answers WHERE key IN ({marks})", chunk
                ).fetchall()
                for key, value in rows:
                    found[key] = json.loads(value)
        return found

    def get(self, key: str) -> Any | None:
        """The value stored under ``key``, or ``None``."""
        return self.get_many([key]).get(key)

    def put_many(self, items: Mapping[str, Any]) -> None:
        """Store ``items`` (key -> JSON-serialisable value) in one transaction."""
        if not items:
            return
        rows = [(key, canonical_json(value)) for key, value in items.items()]
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany("INSERT OR REPLACE INTO answers (key, value) VALUES (?, ?)", rows)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def __len__(self) -> int:
        with self._lock:
            return self._connection().execute("SELECT COUNT(*) FROM answers").fetchone()[0]

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> ServiceCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"the cache {self.path} is closed")
        return self._conn


def open_cache(enabled: bool, path: str | None) -> ServiceCache | None:
    """The cache a service config asks for (``cache``, ``cache_path``), or ``None`` when off."""
    return ServiceCache(path) if enabled else None
