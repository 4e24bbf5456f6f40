"""Validation of a composed config: every problem at once, each with its full key and the fix.

Four passes over the composed ``DictConfig``:

1. structure: keys the schema does not know (typos, or keys added with ``+``), values left
   missing (``???``);
2. field checks declared beside each field in ``schema.py`` and ``services.py`` (ranges, choices);
3. names that pick a registry entry (``judge.backend``, ``simulator.backend``, ``data.kind``,
   ``tracking.backends``), against the registries, plugins' entries included (:func:`registries`);
4. cross-field checks below (tool weights summing to 1, a judge that asks a server needing a
   model, what the reward asks of the summary judge, ...).

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
        problems.extend(judging_problems(cfg))
    if not broken & {"engine", "algorithm"} and "engine" in cfg and "algorithm" in cfg:
        problems.extend(engine.problems(cfg))
    return problems


def judging_problems(cfg: DictConfig) -> list[Problem]:
    """What the reward asks of the summary judge (``reward.judge_*``, ``reward.no_tool_response``).

    The judge must show the view (``judge.backend``'s ``views``); ``reward.judge_prompt`` must
    name a template; the template a judge renders (the reward's, else ``judge.prompt``) may use
    only the ``{{...}}`` fields the view fills.
    """
    from slca_exp.judges import JUDGES, VIEW_FIELDS
    from slca_exp.services.prompts import resolve_prompt, shipped_prompts

    reward, judge = cfg.get("reward"), cfg.get("judge")
    if reward is None or judge is None or judge.get("backend") not in JUDGES:
        return []  # a missing section or an unknown backend is reported elsewhere
    view = str(reward.get("judge_view") or "responses")
    prompt = reward.get("judge_prompt")
    backend = JUDGES.get(judge.backend)
    problems = []
    shows = tuple(getattr(backend, "views", ("responses",)))
    if view not in shows:
        problems.append(
            Problem(
                "reward.judge_view",
                f"judge.backend={judge.backend} does not show the {view} view (it shows: "
                f"{', '.join(shows)})",
                f"use a judge that does (judge=openai, judge=rubric), or "
                f"reward.judge_view={shows[0]}",
            )
        )
    if prompt and resolve_prompt(str(prompt), "judge") is None:
        shipped = ", ".join(shipped_prompts("judge"))
        problems.append(
            Problem(
                "reward.judge_prompt",
                f"no prompt template {prompt!r}: neither a file nor a template shipped in "
                "slca_exp/judges/prompts/",
                f"give the path of a template file, or one of: {shipped}",
            )
        )
        return problems
    try:
        used = backend.template_fields(judge, str(prompt) if prompt else None)
    except FileNotFoundError:
        return problems  # judge.prompt: reported by the judge section's check
    extra = [p for p in used or () if p not in VIEW_FIELDS.get(view, ())]
    if extra:
        key = (
            "reward.judge_prompt"
            if prompt
            else ("judge.prompt" if view == "responses" else "reward.judge_view")
        )
        template = prompt or judge.get("prompt") or "the judge's default template"
        fills = ", ".join("{{" + f + "}}" for f in VIEW_FIELDS[view])
        problems.append(
            Problem(
                key,
                f"{template} uses {', '.join('{{' + p + '}}' for p in extra)}, which "
                f"reward.judge_view={view} does not fill (it fills {fills})",
                "pick a template written for the view: reward.judge_prompt=hierr_judge_v82.txt "
                "for interaction, null (the judge's own) for responses",
            )
        )
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
