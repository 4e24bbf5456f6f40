"""The schema's keys: an unknown key answered with the closest one, types as users write them.

:func:`walk` checks a composed config against the schema (unknown keys, values left missing,
the field checks declared beside each field); :func:`unknown_path_problem` and
:func:`schema_at` answer an override that names no key, at whatever depth it goes wrong. The
``engine`` section is checked against the schema of the run's engine (its own keys included).
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from slca_exp.config.fields import check_of
from slca_exp.config.schema import EngineConfig, RunConfig
from slca_exp.core.problems import Problem


def field_names(schema: type) -> list[str]:
    """Names of the fields of a dataclass schema."""
    return [f.name for f in dataclasses.fields(schema)]


def unknown_key_problem(key: str, schema: type, depth: int | None = None) -> Problem:
    """The problem for a key whose part at ``depth`` the ``schema`` (its parent's) lacks.

    Args:
        key: the full dotted key as the user wrote it.
        schema: the dataclass of the parent of the unknown part.
        depth: index of the unknown part in ``key`` (default: the last part).

    Example:
        >>> from slca_exp.config.schema import RewardConfig
        >>> unknown_key_problem("reward.tool_weight.name", RewardConfig, 1).fix.split(".")[:3]
        ['did you mean reward', 'tool_weights', 'name? Otherwise remove it']

    """
    parts = key.split(".")
    depth = len(parts) - 1 if depth is None else depth
    parent, leaf, tail = ".".join(parts[:depth]), parts[depth], parts[depth + 1 :]
    known = field_names(schema)
    close = difflib.get_close_matches(leaf, known, n=1)
    stem = f"{parent}." if parent else ""
    rest = "".join(f".{t}" for t in tail)
    hint = f"did you mean {stem}{close[0]}{rest}? Otherwise remove it. " if close else "remove it. "
    return Problem(
        key,
        f"unknown key (the schema of {parent or 'the top level'} has no {leaf!r})",
        f"{hint}Known keys{f' of {parent}' if parent else ''}: {', '.join(known)}",
    )


def unknown_path_problem(
    key: str, root: type = RunConfig, engine: type[EngineConfig] = EngineConfig
) -> Problem:
    """The problem for a dotted key that is not in the schema, at whatever depth it goes wrong.

    ``reward.tool_weight.name`` is answered at ``tool_weight`` (did you mean
    ``reward.tool_weights.name``?), not at its last part. ``engine`` is the schema of the run's
    engine (``engine.*`` keys are its own).
    """
    parts = key.split(".")
    schema = root
    for depth, part in enumerate(parts):
        if part not in field_names(schema):
            return unknown_key_problem(key, schema, depth)
        sub = engine if (schema, part) == (RunConfig, "engine") else None
        sub = sub or _dataclass_in(typing.get_type_hints(schema)[part])
        if sub is None:
            head = ".".join(parts[: depth + 1])
            return Problem(
                key,
                f"{head} is a single value ({user_type(typing.get_type_hints(schema)[part])}), "
                "it has no keys",
                f"set {head}=<value>",
            )
        schema = sub
    return Problem(key, "unknown key", f"check the spelling of {key}")


def user_type(hint: Any) -> str:  # noqa: ANN401 - a type hint
    """A type as a user writes its values, not as Python names it.

    Example:
        >>> from slca_exp.config.schema import ToolWeights
        >>> user_type(ToolWeights)
        'a mapping of weights (format, name, key, value, parallel)'
        >>> user_type(float | None), user_type(list[str])
        ('a number, or null', 'a list (written [a,b])')

    """
    args = typing.get_args(hint)
    if type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{' or '.join(user_type(a) for a in inner)}, or null"
    if dataclasses.is_dataclass(hint):
        names = field_names(hint)  # type: ignore[arg-type]
        floats = all(t is float for t in typing.get_type_hints(hint).values())
        return f"a mapping of {'weights' if floats else 'keys'} ({', '.join(names)})"
    origin = typing.get_origin(hint)
    if origin in (list, tuple) or hint in (list, tuple):
        return "a list (written [a,b])"
    if origin is dict or hint is dict:
        return "a mapping, e.g. {a: 1}"
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def walk(
    node: DictConfig,
    schema: type,
    prefix: str,
    problems: list[Problem],
    sections: dict[str, type] | None = None,
) -> None:
    """Check ``node`` against ``schema``; ``sections`` replaces the schema of some of its keys."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    hints = {**typing.get_type_hints(schema), **(sections or {})}
    for key in node:
        full = f"{prefix}{key}"
        if key not in fields:
            problems.append(unknown_key_problem(full, schema))
            continue
        if OmegaConf.is_missing(node, key):
            problems.append(Problem(full, "has no value (???)", f"set it: {full}=<value>"))
            continue
        value = node[key]
        sub = _dataclass_in(hints[key])
        if isinstance(value, DictConfig) and sub is not None:
            walk(value, sub, f"{full}.", problems)
            continue
        check = check_of(schema, key)
        if check is None:
            continue
        for item in value if isinstance(value, ListConfig) else [value]:
            found = check.problem(item)
            if found:
                default = fields[key].default
                example = "" if default is dataclasses.MISSING else f" (default: {full}={default})"
                problems.append(Problem(full, found[0], found[1] + example))


def schema_at(dotted: str, engine: type[EngineConfig] = EngineConfig) -> type | None:
    """The dataclass schema at a dotted path (``""`` = the whole run), if there is one.

    ``engine`` is the schema of the run's engine (``engine.*`` keys are its own).
    """
    node: type | None = RunConfig
    for part in filter(None, dotted.split(".")):
        if node is None:
            return None
        if (node, part) == (RunConfig, "engine"):
            node = engine
            continue
        hint = typing.get_type_hints(node).get(part)
        node = _dataclass_in(hint) if hint is not None else None
    return node


def _dataclass_in(hint: Any) -> type | None:  # noqa: ANN401
    """The dataclass a type hint names (``X`` or ``X | None``), if any."""
    for candidate in typing.get_args(hint) or (hint,):
        if dataclasses.is_dataclass(candidate):
            return candidate  # type: ignore[return-value]
    return None


# --- cross-field checks ---------------------------------------------------------------------
