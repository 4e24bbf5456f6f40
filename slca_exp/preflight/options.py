"""Options that live outside the run's config: one YAML file per option, one dataclass schema.

A cluster profile (``launcher/<name>.yaml``) and a service definition (``service/<name>.yaml``)
are each picked by name on the command line and adjusted with ``<group>.<key>=<value>``
overrides; neither is part of a run's composed config. :func:`load_option` reads one, applies
the overrides and checks every field against its schema (unknown keys with the closest known
one, wrong types, out-of-range values), each problem naming ``<group>.<key>``.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from slca_exp.config.fields import check_of
from slca_exp.core.problems import Problem
from slca_exp.preflight.compose import CONFIG_DIR
from slca_exp.preflight.keys import field_names, unknown_key_problem

T = TypeVar("T")


def option_dirs(group: str, extra_config_dirs: Sequence[str] = ()) -> list[Path]:
    """The folders options of ``group`` are found in: the user's first, then the packaged tree."""
    return [Path(d) / group for d in extra_config_dirs] + [CONFIG_DIR / group]


def option_names(group: str, extra_config_dirs: Sequence[str] = ()) -> list[str]:
    """Every option of ``group`` found in the packaged tree and the user's config folders."""
    return sorted({p.stem for d in option_dirs(group, extra_config_dirs) for p in d.glob("*.yaml")})


def load_option(
    group: str,
    schema: type[T],
    name: str,
    overrides: Sequence[str] = (),
    extra_config_dirs: Sequence[str] = (),
) -> tuple[T | None, list[Problem]]:
    """Load option ``name`` of ``group``, apply ``overrides``, check it against ``schema``.

    Args:
        group: the folder (``launcher``, ``service``), also the keys' prefix.
        schema: the option's dataclass.
        name: the file stem.
        overrides: ``<group>.<key>=<value>`` adjustments from the command line.
        extra_config_dirs: user folders (``--config-dir``) searched before the packaged tree.

    Returns:
        ``(option, [])``, or ``(option, problems)`` where the option has each bad field at its
        default (so that checks across fields can still run on the good ones), or
        ``(None, problems)`` when there is no such option.

    """
    dirs = option_dirs(group, extra_config_dirs)
    path = next((d / f"{name}.yaml" for d in dirs if (d / f"{name}.yaml").is_file()), None)
    if path is None:
        known = ", ".join(option_names(group, extra_config_dirs))
        return None, [
            Problem(
                group,
                f"no {group} option {name!r}",
                f"choose one of: {known}, or add {group}/{name}.yaml to a --config-dir folder",
            )
        ]
    node = OmegaConf.load(path)
    problems = [p for o in overrides if (p := _apply(group, schema, node, o)) is not None]
    problems += _field_problems(group, schema, node)
    bad = {p.key.removeprefix(f"{group}.") for p in problems}
    good = {k: node[k] for k in node if k not in bad}
    option = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), good))
    return typing.cast(T, option), problems


def _apply(group: str, schema: type, node: DictConfig, override: str) -> Problem | None:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        (parsed,) = OverridesParser.create().parse_overrides([override])
    except HydraException as err:
        return Problem(override.split("=")[0], str(err).splitlines()[0], "fix the override")
    leaf = parsed.key_or_group.removeprefix(f"{group}.")
    if leaf not in field_names(schema):
        return unknown_key_problem(parsed.key_or_group, schema)
    node[leaf] = parsed.value()
    return None


def _field_problems(group: str, schema: type, node: DictConfig) -> list[Problem]:
    """Unknown keys, wrong types and out-of-range values, each naming ``<group>.<key>``."""
    problems = []
    hints = typing.get_type_hints(schema)
    for leaf in node:
        key = f"{group}.{leaf}"
        if leaf not in field_names(schema):
            problems.append(unknown_key_problem(key, schema))
            continue
        try:
            value: Any = node[leaf]
            OmegaConf.merge(OmegaConf.structured(schema), {leaf: value})
        except OmegaConfBaseException as err:
            what = str(err).splitlines()[0]
            hint = getattr(hints[leaf], "__name__", str(hints[leaf]))
            problems.append(Problem(key, what, f"give {key} a value of the type {hint}"))
            continue
        found = (check := check_of(schema, str(leaf))) and check.problem(value)
        if found:
            problems.append(Problem(key, found[0], found[1]))
    return problems
