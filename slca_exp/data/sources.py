"""Data sources: where a run's splits come from, one registry keyed by ``data.kind``.

    data.kind --DATA_SOURCES--> DataSource --resolve(config)--> {split: parquet file}, problems
                                           --recorded(config)--> the recipe's data fields

- ``synthetic``: the seeded generator (``synthetic.py``) writes ``sft.parquet``,
  ``train.parquet`` and ``val.parquet`` into ``data.dir`` or, by default,
  ``<output root>/data/synthetic/rows=<N>-seed=<S>/``, when they are missing, one process at a
  time (under ``<folder>.lock``);
- ``files``: ``data.files.{sft,train,val}``, relative to ``data.dir`` (or to the launch folder
  when ``data.dir`` is null); ``sft`` is optional.

Generic code (``splits.py``, the recipe, the preflight checks) asks the source, never the kind's
name. A plugin (``SLCA_EXP_PLUGINS``) registers its own source, an instance of a
:class:`DataSource` subclass: ``DATA_SOURCES.register("lab", LabSource())``, then ``data.kind=lab``.
Whatever it makes, its rows follow ``rows.py``; ``splits.py`` checks them when they are loaded.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from filelock import FileLock

from slca_exp.config.paths import output_root
from slca_exp.config.schema import DataConfig, RunConfig
from slca_exp.core.problems import Problem
from slca_exp.core.shown import shown_path
from slca_exp.data.domain import DOMAIN_VERSION
from slca_exp.data.synthetic import (
    MANIFEST,
    SPLIT_FILES,
    SyntheticFolderError,
    generate,
    split_sizes,
)
from slca_exp.registry import Registry

SPLITS = ("sft", "train", "val")
"""Split names, in the order a run uses them."""


class DataSource(ABC):
    """Where the splits of ``data.kind`` come from.

    Attributes:
        generates: the source writes its split itself, on first use. Then a refused recipe, and a
            check that only looks (``validate``, ``--dry-run``, ``--cfg``), never makes it:
            :meth:`pending_problems` and :meth:`pending_note` say what making it would do.

    """

    generates: bool = False

    def problems(self, data: DataConfig) -> list[Problem]:
        """The problems of the ``data`` config for this source (validation; no file is read)."""
        return []

    @abstractmethod
    def folder(self, config: RunConfig) -> Path:
        """The folder the split files are in (or will be)."""

    @abstractmethod
    def planned(self, config: RunConfig) -> dict[str, Path]:
        """Where the split files are, by split name, without reading or making anything."""

    @abstractmethod
    def resolve(self, config: RunConfig) -> tuple[dict[str, Path], list[Problem]]:
        """The split files that exist (made first by a source that makes them) and the problems.

        Returns:
            split name -> absolute path of its file, and a problem keyed ``data.*`` for each
            file that cannot be had.

        """

    def recorded(self, config: RunConfig) -> dict[str, Any]:
        """What the recipe records besides ``name``, ``kind``, ``seed`` and ``files`` (cheap)."""
        return {}

    def tag(self, recorded: dict[str, Any]) -> str:
        """The run's ``slca.data`` tag: ``<data.name>@<hash of the files' sha256>``.

        Args:
            recorded: the recipe's data component.

        """
        joined = "".join(f"{role}={f['sha256']}" for role, f in sorted(recorded["files"].items()))
        return f"{recorded['name']}@{hashlib.sha256(joined.encode()).hexdigest()[:12]}"

    def pending_problems(self, config: RunConfig) -> list[Problem]:
        """The problems making the split would raise, found without making it."""
        return []

    def pending_note(self, config: RunConfig) -> str | None:
        """What a run would make before it starts, in one line (``None``: nothing)."""
        return None


DATA_SOURCES: Registry[DataSource] = Registry("data source")
"""Data sources, keyed by ``data.kind``."""


def data_source(kind: str) -> DataSource:
    """The source registered as ``kind`` (a config's ``data.kind``).

    Raises:
        UnknownNameError: no source is registered under ``kind``.

    """
    return DATA_SOURCES.get(kind)


def synthetic_dir(config: RunConfig) -> Path:
    """Where a synthetic split lives: ``data.dir`` or the default folder under the output root."""
    d = config.data
    if d.dir:
        return Path(d.dir).expanduser().resolve()
    return output_root(config.tracking) / "data" / "synthetic" / f"rows={d.rows}-seed={d.seed}"


class SyntheticSource(DataSource):
    """``data.kind=synthetic``: the seeded split of ``(data.rows, data.seed)``, made here."""

    generates = True

    def problems(self, data: DataConfig) -> list[Problem]:
        """The generator names its files itself (sft/train/val.parquet, a contract with engines)."""
        return [
            Problem(
                f"data.files.{role}",
                "data.kind=synthetic writes sft.parquet, train.parquet and val.parquet itself",
                f"remove data.files.{role}, or set data.kind=files to read your own files",
            )
            for role in SPLITS
            if getattr(data.files, role)
        ]

    def folder(self, config: RunConfig) -> Path:
        """:func:`synthetic_dir`."""
        return synthetic_dir(config)

    def planned(self, config: RunConfig) -> dict[str, Path]:
        """The three files in :meth:`folder`."""
        folder = self.folder(config)
        return {name: folder / file for name, file in SPLIT_FILES.items()}

    def resolve(self, config: RunConfig) -> tuple[dict[str, Path], list[Problem]]:
        """The three files, generated when the folder lacks them."""
        d, out = config.data, self.folder(config)
        try:
            # Jobs started together generate the same folder: one does, the others then find it.
            with FileLock(f"{out}.lock"):
                paths = generate(out, d.rows, d.seed)
        except (SyntheticFolderError, OSError) as err:
            return {}, [Problem("data.dir", str(err), "set data.dir to an empty or new folder")]
        return {name: path.resolve() for name, path in paths.items()}, []

    def recorded(self, config: RunConfig) -> dict[str, Any]:
        """``rows``, the split ``sizes`` and the ``generator`` version.

        With the seed they determine the split; the files' hashes prove it.
        """
        rows = config.data.rows
        return {"rows": rows, "sizes": split_sizes(rows), "generator": DOMAIN_VERSION}

    def tag(self, recorded: dict[str, Any]) -> str:
        """``synthetic:<name>/rows=<N>,seed=<S>``."""
        return f"synthetic:{recorded['name']}/rows={recorded['rows']},seed={recorded['seed']}"

    def pending_problems(self, config: RunConfig) -> list[Problem]:
        """A folder of split files without our manifest, which the generator would refuse."""
        folder = self.folder(config)
        if (folder / MANIFEST).is_file() or not any(
            (folder / f).exists() for f in SPLIT_FILES.values()
        ):
            return []
        # The generator refuses such a folder before it writes anything, so asking it gives the
        # run's own problem, word for word.
        return self.resolve(config)[1]

    def pending_note(self, config: RunConfig) -> str | None:
        """The split will be generated, unless its folder holds all of it already."""
        d, folder = config.data, self.folder(config)
        if all((folder / f).is_file() for f in (MANIFEST, *SPLIT_FILES.values())):
            return None
        return (
            f"data: the synthetic split (data.rows={d.rows}, data.seed={d.seed}) will be "
            f"generated in {shown_path(folder)}"
        )


class FilesSource(DataSource):
    """``data.kind=files``: the user's parquet files named by ``data.files``."""

    def problems(self, data: DataConfig) -> list[Problem]:
        """``train`` and ``val`` are needed (``sft`` is optional)."""
        if data.files.train and data.files.val:
            return []
        return [
            Problem(
                "data.files",
                "data.kind=files needs at least data.files.train and data.files.val",
                "set data.files.train=<parquet> data.files.val=<parquet> (and data.files.sft)",
            )
        ]

    def folder(self, config: RunConfig) -> Path:
        """``data.dir``, else the launch folder."""
        d = config.data
        return Path(d.dir).expanduser() if d.dir else Path.cwd()

    def planned(self, config: RunConfig) -> dict[str, Path]:
        """Each file ``data.files`` names, relative to :meth:`folder`."""
        base, files = self.folder(config), config.data.files
        return {
            name: (base / Path(getattr(files, name)).expanduser()).resolve()
            for name in SPLITS
            if getattr(files, name)
        }

    def resolve(self, config: RunConfig) -> tuple[dict[str, Path], list[Problem]]:
        """The named files that exist; a problem for each one that does not."""
        d = config.data
        named = [str(getattr(d.files, n)) for n in SPLITS if getattr(d.files, n)]
        if (
            d.instructions
            and not d.dir
            and not all(Path(f).expanduser().is_absolute() for f in named)
        ):
            # A named dataset (data=toucan) lives at a user-given place: the launch folder would
            # be a guess, and three "does not exist" lines would hide the one thing to set.
            return {}, [
                Problem(
                    "data.dir",
                    f"data={d.name} needs the folder holding {', '.join(named)} (data.dir is not "
                    "set)",
                    f"set data.dir=/path/to/folder; {d.instructions}",
                )
            ]
        found, problems = {}, []
        for name, path in self.planned(config).items():
            if path.is_file():
                found[name] = path
            else:
                problems.append(_missing(d, name, path))
        return found, problems


def _missing(d: DataConfig, name: str, path: Path) -> Problem:
    key = f"data.files.{name}"
    where = f" (relative to data.dir={d.dir})" if d.dir else " (relative to the launch folder)"
    fix = f"fix {key} or data.dir"
    if d.instructions:
        fix += f"; {d.instructions}"
    return Problem(key, f"file {str(path)!r} does not exist{where}", fix)


DATA_SOURCES.register("synthetic", SyntheticSource())
DATA_SOURCES.register("files", FilesSource())
