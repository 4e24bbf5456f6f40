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
import dataclasses
import re
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

from slca_exp.config.schema import EngineConfig
from slca_exp.core.problems import ConfigError, Problem
from slca_exp.core.shown import shown_path
from slca_exp.engines import ENGINES, engine_schema  # stores each engine's schema for Hydra
from slca_exp.preflight.keys import field_names, schema_at, unknown_path_problem, user_type
from slca_exp.preflight.validate import engine_schema_of, problems_of

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
    multirun: bool = True,
) -> tuple[list[list[str]], list[DictConfig], list[Problem]]:
    """Expand sweeps, compose every job; ``(jobs, their configs, every problem)``.

    The configs are returned only when there is no problem at all. Jobs that choose the same
    config groups share one Hydra composition (a copy each, with their values applied): a grid
    over weights or seeds composes once. Without ``multirun`` (no ``-m``), a list of values is
    a problem, as Hydra would refuse it once the run starts.
    """
    try:
        jobs = expand_sweeps(overrides)
    except HydraException as err:
        return [], [], [Problem("<overrides>", _first_line(err), "fix the override syntax")]
    if not multirun and len(jobs) > 1:
        return jobs, [], sweep_problems(overrides)
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
    problems = merge_job_problems(found, jobs, overrides)
    return jobs, ([] if problems else cfgs), problems


def merge_job_problems(
    found: dict[Problem, list[list[str]]], jobs: Sequence[Sequence[str]], overrides: Sequence[str]
) -> list[Problem]:
    """One problem per distinct problem of a sweep; one found in only some jobs names them all.

    Args:
        found: each problem -> the override lists of the jobs that have it.
        jobs: every job's override list.
        overrides: the command line's overrides (left out of the job names).

    """
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
    return problems


def sweep_problems(overrides: Sequence[str]) -> list[Problem]:
    """A problem for each list of values given without ``-m`` (Hydra's "Ambiguous value")."""
    problems = []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if not override.is_sweep_override():
            continue
        key = override.key_or_group
        value = (override.input_line or "").partition("=")[2] or "the values"
        problems.append(
            Problem(
                key,
                f"{value} is a list of values to sweep over, and -m (multirun) is not given",
                f"add -m to run one job per value, or give one value ({key}=<value>)",
            )
        )
    return problems


def chosen_backends(
    overrides: Sequence[str],
    group: str,
    *,
    config_name: str = CONFIG_NAME,
    extra_config_dirs: Sequence[str] = (),
) -> set[str]:
    """``<group>.backend`` of the option every job of ``overrides`` chooses for ``group``.

    Only the config-group choices are composed (values are not applied). A job that does not
    compose adds nothing: the full check reports its problem.
    """
    found: set[str] = set()
    with hydra_context():
        try:
            parser, groups = OverridesParser.create(), _group_names()
            choices = {
                tuple(
                    o.input_line for o in parser.parse_overrides(job) if _is_hydra_side(o, groups)
                )
                for job in expand_sweeps(overrides)
            }
        except HydraException:
            return found
        for job in choices:
            try:
                cfg = compose(
                    config_name=config_name, overrides=[*job, *_searchpath(extra_config_dirs)]
                )
            except (HydraException, OmegaConfBaseException):
                continue
            backend = OmegaConf.select(cfg, f"{group}.backend")
            if backend is not None:
                found.add(str(backend))
    return found


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
    hydra_overrides += _searchpath(extra_config_dirs)
    key = (config_name, *hydra_overrides)
    composed = cache.get(key) if cache is not None else None
    if composed is None:
        try:
            composed = compose(config_name=config_name, overrides=hydra_overrides)
        except (HydraException, OmegaConfBaseException) as err:
            composed = _composition_problem(err, hydra_side, extra_config_dirs)
        if cache is not None:
            cache[key] = composed
    if isinstance(composed, Problem):
        return None, [composed]
    cfg = copy.deepcopy(composed) if cache is not None else composed
    problems = [p for o in values if (p := _apply(cfg, o)) is not None]
    return cfg, problems + problems_of(cfg)


def _searchpath(extra_config_dirs: Sequence[str]) -> list[str]:
    """The Hydra override that searches the user's config folders too (none without any)."""
    if not extra_config_dirs:
        return []
    dirs = ",".join(f"file://{Path(d).resolve()}" for d in extra_config_dirs)
    return [f"hydra.searchpath=[{dirs}]"]


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
            return _unknown(key, engine_schema_of(cfg))
        with open_dict(cfg):
            OmegaConf.update(cfg, key, value, merge=True, force_add=True)
    except OmegaConfBaseException as err:
        return _type_problem(key, err, override.value(), engine_schema_of(cfg))
    return None


def _unknown(key: str, engine: type[EngineConfig]) -> Problem:
    """An unknown key; one that another engine's schema has names that engine."""
    problem = unknown_path_problem(key, engine=engine)
    if key.startswith("engine."):
        parent, _, leaf = key.rpartition(".")
        owners = [
            name
            for name in ENGINES
            if (owner := schema_at(parent, engine_schema(name, ENGINES))) is not None
            and leaf in field_names(owner)
        ]
        if owners:
            pick = " or ".join(f"engine={n}" for n in owners)
            return Problem(
                key,
                f"{problem.what}; it is a setting of {pick}",
                f"pick that engine ({pick}) to set it, or remove it",
            )
    return problem


def _type_problem(
    key: str, err: Exception, value: object, engine: type[EngineConfig] = EngineConfig
) -> Problem:
    """A value of the wrong type, both named as the user writes them (not Python's classes)."""
    parent, _, leaf = key.rpartition(".")
    owner = schema_at(parent, engine)
    hint = typing.get_type_hints(owner).get(leaf) if owner else None
    if hint is None:
        return Problem(key, _first_line(err), f"give {key} a value the schema accepts")
    wanted = user_type(hint)
    example = ""
    if dataclasses.is_dataclass(hint):
        first = dataclasses.fields(hint)[0].name
        example = f", e.g. {key}.{first}=<value> for one of them"
    return Problem(
        key,
        f"takes {wanted}, got {_as_written(value)}",
        f"give {key} {wanted}{example}",
    )


def _as_written(value: object) -> str:
    """A parsed override value as it was written on the command line."""
    return repr(value) if isinstance(value, str) else str(value)


def _composition_problem(
    err: Exception, hydra_side: list[Override], extra_config_dirs: Sequence[str] = ()
) -> Problem:
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
    option = _IN_OPTION.match(text)
    if option is None or key == "<config>":
        return Problem(key, _first_line(err), "fix the YAML option or the override named above")
    # A key of a config option file, the user's own or ours: name the file and the line.
    where = _origin(option.group("path"), key, _search_dirs(hydra_side, extra_config_dirs))
    lines = [line.strip() for line in text.splitlines()[1:] if line.strip()]
    detail = lines[0] if lines else _first_line(err)
    group, _, name = option.group("path").rpartition("/")
    engine = engine_schema(name, ENGINES) if group == "engine" else EngineConfig
    if detail.startswith("Key '"):  # a key the schema does not have
        unknown = unknown_path_problem(key, engine=engine)
        return Problem(key, f"{unknown.what}, in {where}", unknown.fix)
    parent, _, leaf = key.rpartition(".")
    owner = schema_at(parent, engine)
    hint = typing.get_type_hints(owner).get(leaf) if owner else None
    if hint is None:
        return Problem(key, f"{detail}, in {where}", f"fix {key} in {where}")
    value = _GOT.match(detail)
    got = f"takes {user_type(hint)}, got {value.group(1)!r}" if value else detail
    return Problem(key, f"{got}, in {where}", f"give {key} {user_type(hint)} in {where}")


_GOT = re.compile(r"Value '(.*)' of type '\w+' could not be converted")
_IN_OPTION = re.compile(r"In '(?P<path>[^']+)': ")
"""How Hydra names the option file a composition error comes from (``In 'judge/vllm': ...``)."""


def _search_dirs(hydra_side: list[Override], extra_config_dirs: Sequence[str]) -> list[Path]:
    """The config folders in Hydra's order: ours, ``--config-dir``, ``hydra.searchpath``."""
    dirs = [CONFIG_DIR, *(Path(d) for d in extra_config_dirs)]
    for override in hydra_side:
        if override.key_or_group == "hydra.searchpath":
            value = override.value()
            for entry in value if isinstance(value, list) else [value]:
                if str(entry).startswith("file://"):
                    dirs.append(Path(str(entry).removeprefix("file://")))
    return dirs


def _origin(option: str, key: str, dirs: Sequence[Path]) -> str:
    """``file:line`` of ``key``'s last part in the option file ``option`` (``judge/vllm``).

    The file is named from the current folder when it lies under it (``myconf/judge/vllm.yaml``).
    """
    leaf = key.rpartition(".")[2]
    pattern = re.compile(rf"^\s*{re.escape(leaf)}\s*:")
    for folder in dirs:
        path = folder.expanduser().resolve() / f"{option}.yaml"
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if pattern.match(line):
                return f"{shown_path(path)}:{number}"
        return shown_path(path)
    return f"the option {option}"


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
