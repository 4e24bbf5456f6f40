"""Compose a run config from ``conf/`` and command-line overrides, collecting every problem.

Hydra stops at the first bad override. To report all of them at once, overrides are split:
config-group choices (``algorithm=grpo``, ``experiment=smoke``) and ``hydra.*`` settings go to
Hydra's compose API; value overrides (``algorithm.eps=-1``, ``+algorithm.bogus=3``, ``seed=3``)
are then applied here one by one onto the typed config, with Hydra's own semantics for ``+``,
``++`` and ``~``, and every failure becomes a :class:`Problem`. The result then goes through
``validate.problems_of``. Sweeps (``a=1,2``) are expanded so that every job of a multirun is
checked before any job starts.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from slca_exp.config.validate import (
    ConfigError,
    Problem,
    problems_of,
    schema_at,
    unknown_key_problem,
)

CONFIG_DIR = Path(__file__).resolve().parent.parent / "conf"
"""The packaged config tree (``slca_exp/conf``, shipped as package data)."""

CONFIG_NAME = "config"


@contextmanager
def hydra_context(config_dir: Path | str = CONFIG_DIR) -> Iterator[None]:
    """Initialise Hydra on a config folder for the duration of the block."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(
        config_dir=str(Path(config_dir).resolve()), version_base="1.3", job_name="slca-exp"
    ):
        yield


def compose_run(
    overrides: Sequence[str] = (),
    *,
    config_name: str = CONFIG_NAME,
    extra_config_dirs: Sequence[str] = (),
) -> DictConfig:
    """Compose and validate one run.

    Args:
        overrides: Hydra overrides without sweeps (``key=value``, ``group=option``, ``+k=v``).
        config_name: the primary config.
        extra_config_dirs: user folders searched after ``conf/`` (like ``--config-dir``).

    Returns:
        The composed config; every problem raises.

    Raises:
        ConfigError: listing every problem found.

    """
    with hydra_context():
        cfg, problems = _compose(list(overrides), config_name, extra_config_dirs)
    if problems:
        raise ConfigError(problems)
    return cfg


def check_overrides(
    overrides: Sequence[str],
    *,
    config_name: str = CONFIG_NAME,
    extra_config_dirs: Sequence[str] = (),
) -> tuple[int, list[Problem]]:
    """Expand sweeps and return ``(number of jobs, every problem of every job)``.

    A problem found in only some jobs of a sweep lists the swept overrides of every such job in
    its message, so that a refused sweep names each of its bad points.
    """
    jobs, _, problems = compose_jobs(
        overrides, config_name=config_name, extra_config_dirs=extra_config_dirs
    )
    return len(jobs), problems


def compose_jobs(
    overrides: Sequence[str],
    *,
    config_name: str = CONFIG_NAME,
    extra_config_dirs: Sequence[str] = (),
) -> tuple[list[list[str]], list[DictConfig], list[Problem]]:
    """Expand sweeps, compose every job; ``(jobs, their configs, every problem)``.

    The configs are returned only when there is no problem at all. Jobs that choose the same
    config groups share one Hydra composition (a copy each, with their values applied): a grid
    over weights or seeds composes once.
    """
    try:
        jobs = expand_sweeps(overrides)
    except HydraException as err:
        return [], [], [Problem("<overrides>", _first_line(err), "fix the override syntax")]
    found: dict[Problem, list[list[str]]] = {}
    cfgs: list[DictConfig] = []
    cache: dict[tuple[str, ...], DictConfig | Problem] = {}
    with hydra_context():
        for job in jobs:
            cfg, job_problems = _compose(job, config_name, extra_config_dirs, cache)
            for problem in job_problems:
                found.setdefault(problem, []).append(job)
            if cfg is not None:
                cfgs.append(cfg)
    problems = []
    for problem, where in found.items():
        if len(where) < len(jobs):  # only some jobs of the sweep: say which, all of them
            points = "; ".join(" ".join(o for o in job if o not in overrides) for job in where)
            problem = Problem(
                problem.key,
                f"{problem.what} [in {len(where)} of {len(jobs)} jobs: {points}]",
                problem.fix,
            )
        problems.append(problem)
    return jobs, ([] if problems else cfgs), problems


def expand_sweeps(overrides: Sequence[str]) -> list[list[str]]:
    """The override list of every job of a sweep (one list when nothing is swept)."""
    # The basic sweeper's own expansion, so that the jobs checked are the jobs Hydra launches.
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    if not any(o.is_sweep_override() for o in parsed):
        return [list(overrides)]
    batches = BasicSweeper.split_arguments(parsed, None)
    return [list(job) for batch in batches for job in batch]


def _compose(
    overrides: list[str],
    config_name: str,
    extra_config_dirs: Sequence[str],
    cache: dict[tuple[str, ...], DictConfig | Problem] | None = None,
) -> tuple[DictConfig | None, list[Problem]]:
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as err:
        return None, [Problem("<overrides>", _first_line(err), "fix the override syntax")]
    groups = _group_names()
    hydra_side = [o for o in parsed if _is_hydra_side(o, groups)]
    values = [o for o in parsed if not _is_hydra_side(o, groups)]
    hydra_overrides = [o.input_line for o in hydra_side if o.input_line]
    if extra_config_dirs:
        dirs = ",".join(f"file://{Path(d).resolve()}" for d in extra_config_dirs)
        hydra_overrides.append(f"hydra.searchpath=[{dirs}]")
    key = (config_name, *hydra_overrides)
    composed = cache.get(key) if cache is not None else None
    if composed is None:
        try:
            composed = compose(config_name=config_name, overrides=hydra_overrides)
        except (HydraException, OmegaConfBaseException) as err:
            composed = _composition_problem(err, hydra_side)
        if cache is not None:
            cache[key] = composed
    if isinstance(composed, Problem):
        return None, [composed]
    cfg = copy.deepcopy(composed) if cache is not None else composed
    problems = [p for o in values if (p := _apply(cfg, o)) is not None]
    return cfg, problems + problems_of(cfg)


def _group_names() -> set[str]:
    loader = GlobalHydra.instance().config_loader()
    return set(loader.list_groups(""))


def _is_hydra_side(override: Override, groups: set[str]) -> bool:
    key = override.key_or_group
    if key.startswith("hydra") or override.package is not None or "/" in key:
        return True
    return key in groups


def _apply(cfg: DictConfig, override: Override) -> Problem | None:
    """Apply one value override the way Hydra would; return the problem instead of raising."""
    key = override.key_or_group
    missing = object()
    exists = OmegaConf.select(cfg, key, default=missing, throw_on_missing=False) is not missing
    try:
        if override.is_delete():
            if not exists:
                return Problem(
                    key, "cannot delete a key that is not in the config", f"remove ~{key}"
                )
            parent, _, leaf = key.rpartition(".")
            with open_dict(cfg):
                node = OmegaConf.select(cfg, parent) if parent else cfg
                del node[leaf]
            return None
        value = override.value()
        if override.is_add() and exists:
            return Problem(
                key,
                f"+{key} adds a key, but {key} is already in the config",
                f"write {key}={override.get_value_element_as_str()} to change it",
            )
        if not exists and not (override.is_add() or override.is_force_add()):
            return _unknown(key)
        with open_dict(cfg):
            OmegaConf.update(cfg, key, value, merge=True, force_add=True)
    except OmegaConfBaseException as err:
        return Problem(key, _first_line(err), f"give {key} a value of the type {_type_hint(key)}")
    return None


def _unknown(key: str) -> Problem:
    parent = key.rpartition(".")[0]
    owner = schema_at(parent)
    if owner is None:
        return Problem(key, "unknown key", f"check the spelling of {key}")
    return unknown_key_problem(key, owner)


def _type_hint(key: str) -> str:
    parent, _, leaf = key.rpartition(".")
    owner = schema_at(parent)
    hint = typing.get_type_hints(owner).get(leaf) if owner else None
    return getattr(hint, "__name__", str(hint)) if hint is not None else "the schema expects"


def _composition_problem(err: Exception, hydra_side: list[Override]) -> Problem:
    text = str(err)
    if isinstance(err, MissingConfigException):
        for override in hydra_side:
            group = override.key_or_group
            if f"'{group}/" in text or f"{group}:" in text:
                options = GlobalHydra.instance().config_loader().get_group_options(group)
                return Problem(
                    group,
                    f"no option {override.get_value_element_as_str()!r} in group {group}",
                    f"choose one of: {', '.join(options)}, or add {group}/<name>.yaml to a "
                    "config folder given with --config-dir",
                )
    key = "<config>"
    for line in text.splitlines():
        if "full_key:" in line:
            key = line.split("full_key:", 1)[1].strip()
    return Problem(key, _first_line(err), "fix the YAML option or the override named above")


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
