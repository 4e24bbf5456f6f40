"""``engine.verl.overrides`` and ``sft_overrides``: raw verl values, applied with Hydra's syntax.

    ["key=value", "+new.key=value", "++key=value", "~key", ...]   (our key ``where``)
      -> Hydra's override parser, one text at a time
      -> each applied to the composed verl config, in place, values only
      == [Problem(where[i], what, fix), ...]        one per bad override; [] when all applied

An override may set, add (``+``), force (``++``) or delete (``~``) a value of verl's config;
picking one of verl's config groups, a sweep, or a key verl does not have (with a close match
suggested) is a problem on the override's own place in our list.
"""

from __future__ import annotations

import difflib

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from slca_exp.core.problems import Problem
from slca_exp.engines.verl.compose import has_key, verl_groups
from slca_exp.engines.verl.problems import first_line

SYNTAX = "write key=value, +key=value (a new key), ++key=value or ~key with verl's key names"
"""How an override is written (the fix of a malformed one)."""


def apply_overrides(cfg: DictConfig, overrides: list[str], where: str) -> list[Problem]:
    """Apply every override of the list held by our key ``where``; the problems of the bad ones."""
    return [
        problem
        for i, text in enumerate(overrides)
        if (problem := apply_override(cfg, text, f"{where}[{i}]")) is not None
    ]


def apply_override(cfg: DictConfig, text: str, where: str) -> Problem | None:
    """Apply one verl value override with Hydra's semantics; a problem instead of raising."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        (override,) = OverridesParser.create().parse_overrides([text])
    except HydraException as err:
        return Problem(where, f"{text!r} is not an override: {first_line(err)}", SYNTAX)
    key = override.key_or_group
    if override.package is not None or "/" in key or key in verl_groups():
        return Problem(
            where,
            f"{text!r} picks a verl config group; only values can be overridden here",
            "set the values you need one by one, e.g. actor_rollout_ref.actor.clip_ratio=0.2",
        )
    if override.is_sweep_override():
        return Problem(where, f"{text!r} is a sweep", "sweep our keys with -m; one value here")
    exists = has_key(cfg, key)
    try:
        with open_dict(cfg):
            if override.is_delete() and exists:
                parent, _, leaf = key.rpartition(".")
                del (OmegaConf.select(cfg, parent) if parent else cfg)[leaf]
            elif override.is_add() and exists:
                return Problem(where, f"verl already has {key}", f"write {key}=<value>")
            elif not exists and not (override.is_add() or override.is_force_add()):
                return _not_a_key(cfg, key, where, override.is_delete())
            else:
                OmegaConf.update(cfg, key, override.value(), merge=True, force_add=True)
    except (OmegaConfBaseException, ValueError) as err:
        return Problem(where, f"{text!r}: {first_line(err)}", SYNTAX)
    return None


def _not_a_key(cfg: DictConfig, key: str, where: str, delete: bool) -> Problem:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    close = difflib.get_close_matches(leaf, list(node), n=1) if isinstance(node, DictConfig) else []
    hint = f"did you mean {parent + '.' if parent else ''}{close[0]}? " if close else ""
    return Problem(
        where,
        f"verl's config has no key {key!r}",
        f"{hint}use verl's key names (verl/trainer/config/*.yaml)"
        + ("" if delete else f", or +{key}=... to add one"),
    )
