"""sha256 of files, cached per file version.

The recipe records the sha256 of every file a run reads (data splits, chat templates, prompt
templates); caches are keyed by them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK = 1 << 20
_HASHES: dict[tuple[str, int, int], str] = {}


def sha256_file(path: str | Path) -> str:
    """sha256 (hex) of a file, read in 1 MiB chunks; cached per (path, size, mtime).

    The cache matters because ``slca-exp train`` builds the recipe twice in one process: once
    before Hydra starts (so that a bad recipe creates nothing) and once inside the job.
    """
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        digest = hashlib.sha256()
        with p.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]
