"""Validation of a composed config: every problem at once, each with its full key and the fix.

Four passes over the composed ``DictConfig``:

1. structure: keys the schema does not know (typos, or keys added with ``+``), values left
   missing (``???``);
2. field checks declared beside each field in ``schema.py`` and ``services.py`` (ranges, choices);
3. names that pick a registry entry (``judge.backend``, ``simulator.backend``, ``data.kind``,
   ``tracking.backends``), against the registries, plugins' entries included (:func:`registries`);
4. cross-field checks below (tool weights summing to 1, a judge that asks a server needing a
   model, ...).

Type errors are caught earlier, when values are merged onto the schema (``compose.py``).
"""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, OmegaConf

from slca_exp.config.schema import EngineConfig, RunConfig
from slca_exp.config.weights import normalized_tool_weights
from slca_exp.core.problems import ConfigError, Problem
from slca_exp.preflight.keys import walk
from slca_exp.preflight.sections import CROSS_CHECKS, outcome_problems, unregistered_names


def problems_of(cfg: DictConfig) -> list[Problem]:
    """Every problem of a composed config (empty when it is valid)."""
    problems: list[Problem] = []
    engine = engine_schema_of(cfg)
    walk(cfg, RunConfig, "", problems, {"engine": engine})
    broken = {p.key.split(".")[0] for p in problems}
    problems.extend(unregistered_names(cfg))
    for section, check in CROSS_CHECKS.items():
        if section not in broken and section in cfg:
            problems.extend(check(cfg[section]))
    if not broken & {"reward", "judge"}:
        problems.extend(outcome_problems(cfg))
    if not broken & {"engine", "algorithm"} and "engine" in cfg and "algorithm" in cfg:
        problems.extend(engine.problems(cfg))
    return problems


def engine_schema_of(cfg: DictConfig) -> type[EngineConfig]:
    """The schema of the engine ``cfg`` names (``engine.name``): its own keys and checks.

    The base :class:`EngineConfig` when the name is not that of a registered engine (which
    ``engine.name`` itself reports).
    """
    from slca_exp.engines import ENGINES, engine_schema

    name = OmegaConf.select(cfg, "engine.name", default=None, throw_on_missing=False)
    return engine_schema(name, ENGINES) if isinstance(name, str) else EngineConfig


def validate(cfg: DictConfig) -> RunConfig:
    """Return the typed :class:`RunConfig` of a composed config.

    Raises:
        ConfigError: listing every problem found.

    """
    problems = problems_of(cfg)
    if problems:
        raise ConfigError(problems)
    plain = OmegaConf.to_container(cfg, resolve=True)
    schema = OmegaConf.structured(RunConfig)
    schema.engine = OmegaConf.structured(engine_schema_of(cfg))  # the engine's own keys
    config = OmegaConf.to_object(OmegaConf.merge(schema, plain))
    _rescale_tool_weights(config)
    return config


def _rescale_tool_weights(config: RunConfig) -> None:
    """Rescale the tool weights to sum to 1 when ``reward.normalize`` is set.

    The typed config, hence the recorded recipe, then carries the rescaled values.
    """
    weights = config.reward.tool_weights
    if not config.reward.normalize:
        return
    names = [f.name for f in dataclasses.fields(weights)]
    rescaled = normalized_tool_weights({name: getattr(weights, name) for name in names})
    for name, value in rescaled.items():
        setattr(weights, name, value)
