"""Problems on verl's keys, told in ours: the user never has to learn verl's names to fix a run.

    verl key + what is wrong
      -> keyed_problem(key, what, fix, sources=..., fixed=..., overrides=..., also=...)
      == Problem(verl key, what, fix + "change <our key>" | "slca-exp always sets ..." |
                 "set it in engine.verl.overrides")

Each translation (``rl_config.py``, ``sft_config.py``) binds its own tables into a one-argument
helper (``rl_config.problem``, ``sft_config.sft_problem``); :func:`unresolved` finds the keys a
translated config leaves without a value, and :func:`first_line` shortens verl's messages.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from slca_exp.core.problems import Problem


def keyed_problem(
    key: str,
    what: str,
    fix: str = "",
    *,
    sources: Mapping[str, str],
    fixed: Mapping[str, Any],
    overrides: str,
    also: Mapping[str, str],
) -> Problem:
    """A problem on verl key ``key``; the fix names the key of ours it is translated from.

    Args:
        key: verl's key (``trainer.logger[1]`` comes from ``trainer.logger``).
        what: what is wrong.
        fix: how to fix it in verl's terms (our key is appended).
        sources: verl key -> our key (the RL or the SFT translation's table).
        fixed: the values slca-exp always sets.
        overrides: where raw verl overrides of that config go.
        also: keys of ours that take part besides the source.

    """
    key_of = re.sub(r"\[\d+\]$", "", key)
    if key_of in sources:
        with_ = f" (with {also[key_of]})" if key_of in also else ""
        where = f"change {sources[key_of]}{with_}"
    elif key_of in fixed:
        where = f"slca-exp always sets {key_of}={fixed[key_of]}; override it in {overrides}"
    else:
        where = f"set it in {overrides}"
    return Problem(key, what, f"{fix}; {where}" if fix else where)


def unresolved(
    cfg: DictConfig, problem_on: Callable[[str, str], Problem], unused: tuple[str, ...] = ()
) -> list[Problem]:
    """Keys of ``cfg`` left at ``???`` or whose interpolation fails (``cfg`` is resolved).

    Args:
        cfg: a translated config, resolved in place when nothing is missing.
        problem_on: (verl key, what is wrong) -> the problem, naming our key.
        unused: key prefixes verl never reads with these settings (their ``???`` is fine).

    Returns:
        Every key with no value; else the first interpolation that fails; else ``[]``.

    """
    try:  # missing_keys, too, reads every value: a broken interpolation fails there first
        missing = [
            problem_on(key, "has no value (???)")
            for key in sorted(OmegaConf.missing_keys(cfg))
            if not key.startswith(unused)
        ]
        if not missing:
            OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        return [problem_on(str(getattr(err, "full_key", "") or "<verl config>"), first_line(err))]
    return missing


def first_line(err: BaseException) -> str:
    """The first non-blank line of an error's message (its type's name when there is none)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
