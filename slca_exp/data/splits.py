"""Resolve, load, check and hash the splits a config names.

    config --data source of data.kind (sources.py)--> split files --load, check, hash--> Split

Where the files are, and whether they are made first, is the data source's business
(``sources.py``: ``synthetic`` generates its split, one process at a time, so that jobs started
together never see each other's half-written folder; ``files`` reads the user's). Every split that
is loaded is checked row by row against ``rows.py``; a missing file or a bad row is a
:class:`DataError` naming the key ``data.files.<split>`` and how to fix it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slca_exp.config.schema import RunConfig
from slca_exp.core.hashing import sha256_file
from slca_exp.core.problems import Problem
from slca_exp.data.rows import MAX_REPORTED, bad_rows
from slca_exp.data.sources import SPLITS, data_source, synthetic_dir
from slca_exp.data.synthetic import SPLIT_FILES


class DataError(ValueError):
    """A split cannot be used; ``problems`` name the keys (``data.files.train``, ...) and fixes."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(problems)
        self.problems = problems

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)


@dataclass(frozen=True)
class Split:
    """One loaded and checked split.

    Attributes:
        name: ``sft`` | ``train`` | ``val``.
        path: the parquet file (absolute).
        rows: its rows as plain Python objects (``pyarrow`` ``to_pylist``).
        sha256: hex digest of the file.
        num_rows: ``len(rows)``.

    """

    name: str
    path: Path
    rows: list[dict[str, Any]]
    sha256: str
    num_rows: int


def split_files(config: RunConfig) -> dict[str, Path]:
    """The split files of a config, by split name, made first by a source that makes them.

    Raises:
        DataError: a configured file does not exist, or a synthetic folder is not ours.

    """
    found, problems = data_source(config.data.kind).resolve(config)
    if problems:
        raise DataError(problems)
    return found


def load_split(path: str | Path, name: str) -> Split:
    """Read one split and check every row.

    Raises:
        DataError: the file is missing or not parquet, or rows break the layout (each listed
            with its index and what is wrong).

    """
    path = Path(path).resolve()
    rows = _read_rows(path, name)
    bad = bad_rows(rows, name)
    if bad:
        raise DataError([_bad_rows_problem(name, path, len(rows), bad)])
    return Split(name, path, rows, sha256_file(path), len(rows))


def load_splits(config: RunConfig) -> dict[str, Split]:
    """Every split the config has, loaded and checked (every problem reported at once).

    Raises:
        DataError: listing each missing file and each split with bad rows.

    """
    loaded, problems = {}, []
    for name, path in split_files(config).items():
        try:
            loaded[name] = load_split(path, name)
        except DataError as err:
            problems += err.problems
    if problems:
        raise DataError(problems)
    return loaded


def describe_split(path: str | Path, name: str) -> dict[str, Any]:
    """What the recipe records of a split: ``path``, ``sha256`` and ``rows``; rows are checked.

    The result is cached per file content, because ``slca-exp train`` builds the recipe twice in
    one process and a Toucan split has tens of thousands of rows.

    Raises:
        DataError: as :func:`load_split`.

    """
    path = Path(path).resolve()
    digest = sha256_file(path)
    key = (digest, name)
    if key not in _CHECKED:
        _CHECKED[key] = load_split(path, name).num_rows
    return {"path": str(path), "sha256": digest, "rows": _CHECKED[key]}


_CHECKED: dict[tuple[str, str], int] = {}


def _read_rows(path: Path, name: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq
    from pyarrow import ArrowException

    key = f"data.files.{name}"
    if not path.is_file():
        raise DataError([Problem(key, f"file {str(path)!r} does not exist", f"fix {key}")])
    try:
        return pq.read_table(path).to_pylist()
    except (ArrowException, OSError) as err:
        raise DataError(
            [
                Problem(
                    key,
                    f"{str(path)!r} is not a parquet file (pyarrow: {type(err).__name__})",
                    f"give {key} a .parquet file in the layout of slca_exp/data/rows.py",
                )
            ]
        ) from None


def _bad_rows_problem(name: str, path: Path, total: int, bad: list[tuple[int, str]]) -> Problem:
    key = f"data.files.{name}"
    first = ", ".join(str(i) for i, _ in bad[:MAX_REPORTED])
    more = ", ..." if len(bad) > MAX_REPORTED else ""
    lines = [f"row {i}: {what}" for i, what in bad[:MAX_REPORTED]]
    head = (
        f"{str(path)!r}: {len(bad)} of {total} rows break the row layout (bad rows: {first}{more})"
    )
    return Problem(
        key,
        "\n      ".join([head, *lines]),
        "repair or drop those rows (layout: slca_exp/data/rows.py); for a synthetic split, "
        "delete its folder to regenerate it",
    )


def recorded_files(config: RunConfig) -> dict[str, dict[str, Any]]:
    """Every split of a config as the recipe records it (made first by a source that makes it).

    Raises:
        DataError: every missing file and every split with bad rows.

    """
    found, problems = data_source(config.data.kind).resolve(config)
    out = {}
    for name, path in found.items():
        try:
            out[name] = describe_split(path, name)
        except DataError as err:
            problems += err.problems
    if problems:
        raise DataError(problems)
    return out


__all__ = [
    "SPLITS",
    "SPLIT_FILES",
    "DataError",
    "Split",
    "describe_split",
    "load_split",
    "load_splits",
    "recorded_files",
    "split_files",
    "synthetic_dir",
]
