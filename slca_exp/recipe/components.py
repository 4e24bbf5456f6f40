"""The components of a recipe: what each of the five records, checked as it is built.

Each builder appends what keeps its component from being complete to ``problems`` (a
:class:`~slca_exp.core.problems.Problem` naming the key) rather than raising, so that
:func:`~slca_exp.recipe.build_recipe` reports every problem at once.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from slca_exp.config.schema import RunConfig
from slca_exp.config.services import ServiceConfig
from slca_exp.config.weights import normalized_tool_weights
from slca_exp.core.hashing import sha256_file
from slca_exp.core.problems import Problem

PROMPTED = ("judge", "simulator")
"""The components whose prompt template (or rule) goes to MLflow's prompt registry (and, under
``reward.tool_reward=outcome``, the outcome judge's: ``outcome``, ``outcome_fallback``)."""

_HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")
_PROMPT_NAME = re.compile(r"[^\w.-]")


def backbone_of(config: RunConfig, problems: list[Problem]) -> dict[str, Any]:
    """The backbone: its source and path, and the sha256 of its chat template."""
    b = config.backbone
    out: dict[str, Any] = {
        "name": b.name,
        "source": b.source,
        "path": b.path,
        "revision": b.revision,
        "dtype": b.dtype,
        "chat_template": None,
    }
    if b.source == "builtin":
        out["arch"] = plain(b.arch)
    elif b.source == "local" and b.path and not Path(b.path).is_dir():
        problems.append(
            Problem(
                "backbone.path",
                f"backbone.source=local but {b.path!r} is not a folder",
                "point backbone.path at the folder holding the weights (config.json, ...)",
            )
        )
    elif b.source == "hf" and b.path and not (Path(b.path).is_dir() or _HUB_ID.fullmatch(b.path)):
        problems.append(
            Problem(
                "backbone.path",
                f"{b.path!r} is neither a local folder nor a hub id (org/name)",
                "set backbone.path=<org>/<model> (and pin backbone.revision) or a local folder",
            )
        )
    if b.chat_template:
        template = Path(b.chat_template)
        if template.is_file():
            out["chat_template"] = {
                "path": str(template.resolve()),
                "sha256": sha256_file(template),
            }
        else:
            problems.append(
                Problem(
                    "backbone.chat_template",
                    f"chat-template file {b.chat_template!r} does not exist",
                    "give the path of a jinja template file, or null for the tokenizer's own",
                )
            )
    elif b.source == "builtin":
        from slca_exp.backbones.chat import TEMPLATE_SHA256

        out["chat_template"] = {"path": "builtin", "sha256": TEMPLATE_SHA256}
    hub = b.source == "hf" and b.path and (Path(b.path).is_dir() or _HUB_ID.fullmatch(b.path))
    if hub and type(config.engine).weights_on_this_host:
        # An engine that loads weights on this machine (the local engine): refuse before
        # anything starts. (A verl run loads them on the cluster's nodes, whose caches this
        # host cannot see.)
        from slca_exp.backbones.hf import folder_template_sha256, missing, resolve_local

        folder = resolve_local(b.path, b.revision)
        if folder is None:
            problems.append(Problem("backbone.path", *missing(b.source, b.path, b.revision)))
        elif not b.chat_template:
            sha = folder_template_sha256(folder)
            out["chat_template"] = {"path": "tokenizer", "sha256": sha} if sha else None
    elif b.source == "local" and b.path and not b.chat_template and Path(b.path).is_dir():
        from slca_exp.backbones.hf import folder_template_sha256

        sha = folder_template_sha256(Path(b.path))
        out["chat_template"] = {"path": "tokenizer", "sha256": sha} if sha else None
    return out


def reward_of(config: RunConfig) -> dict[str, Any]:
    """The reward: its variant's rules and the weights that score."""
    # Imported here: the rewards pull in torch, which importing the recipe module should not.
    from slca_exp.rewards.hierr import RULES

    r = config.reward
    weights = plain(r.tool_weights)
    if r.normalize:
        # Validation guarantees a positive sum; the rescaled weights are the ones that score.
        weights = normalized_tool_weights(weights)
    return {
        "name": r.name,
        "variant": r.variant,
        "rules": RULES[r.variant],
        "tool_weights": weights,
        "normalized": r.normalize,
        "process_weight": r.process_weight,
        "summary_weight": r.summary_weight,
        "no_call_penalty": r.no_call_penalty,
        "judge_failure": r.judge_failure,
        "normalize_strings": r.normalize_strings,
        # Under the outcome reward only, so that a HierR recipe keeps the fingerprint it had.
        **_outcome(config),
        # Likewise only where set: the summary judge's view, template and rule under this
        # reward (reward=hierr_v82), and the logged HierR score's own weights (ablation=no_hierr).
        **_judging(config),
        **({"logged_weights": plain(r.logged_weights)} if r.logged_weights is not None else {}),
    }


def _judging(config: RunConfig) -> dict[str, Any]:
    """What the reward asks of the summary judge, when it is not the main reward's."""
    from slca_exp.judges import describe_judging

    judging = describe_judging(config.reward)
    return {} if judging is None else {"judging": judging}


def _outcome(config: RunConfig) -> dict[str, Any]:
    """``tool_reward`` and the outcome judge's fields, when R_tool is the outcome verdict."""
    if config.reward.tool_reward == "hierr":
        return {}
    from slca_exp.judges import describe_outcome

    return {
        "tool_reward": config.reward.tool_reward,
        "outcome": describe_outcome(config.reward, config.judge),
    }


def service_of(
    group: str,
    svc: ServiceConfig,
    problems: list[Problem],
    served: Any = None,  # noqa: ANN401 - a services.served.Resolved
) -> dict[str, Any]:
    """The judge's or simulator's description, as its own package gives it.

    With the identity of the service it is served by (``slca-exp serve``), when it names one.
    """
    # Imported here: only recipe building needs them, and they pull in the HTTP client.
    if group == "judge":
        from slca_exp.judges import describe_judge as describe
    else:
        from slca_exp.simulators import describe_simulator as describe
    try:
        described = dict(describe(svc))
    except FileNotFoundError as err:
        what = f"file {err.filename!r} does not exist" if err.filename else str(err)
        problems.append(
            Problem(
                f"{group}.prompt",
                what,
                f"point {group}.prompt at an existing template file, or null for the shipped one",
            )
        )
        return {"name": svc.name, "backend": svc.backend}
    if served is not None:
        described["service"] = served.identity()
    return described


def prompt_registry_name(group: str, description: dict[str, Any]) -> str:
    """The stable prompt-registry name of a judge's or simulator's template.

    ``slca-exp.<group>.<template file stem>`` for a template file, else
    ``slca-exp.<group>.<backend>`` (a rule such as the rubric's); editing the template adds a
    version under the same name.

    Example:
        >>> prompt_registry_name("judge", {"backend": "openai", "prompt": "hierr_judge_v1.txt"})
        'slca-exp.judge.hierr_judge_v1'
        >>> prompt_registry_name("simulator", {"backend": "replay", "prompt_version": "replay-v2"})
        'slca-exp.simulator.replay'

    """
    prompt = description.get("prompt")
    stem = Path(str(prompt)).stem if prompt else description.get("backend") or description["name"]
    return _PROMPT_NAME.sub("_", f"slca-exp.{group}.{stem}")


def prompts_of(
    config: RunConfig, components: dict[str, Any]
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The registry entries and texts of the judge's and simulator's templates.

    A backend that has no text to register, or whose text does not hash to the recorded
    ``prompt_sha256``, is left out: a registry version must stand for exactly that sha256.
    """
    from slca_exp.judges import JUDGES
    from slca_exp.simulators import SIMULATORS

    registries = {"judge": JUDGES, "simulator": SIMULATORS}
    entries: dict[str, dict[str, Any]] = {}
    texts: dict[str, str] = {}
    for group in PROMPTED:
        svc = getattr(config, group)
        described = components[group]
        text = registries[group].get(svc.backend).prompt_text(svc)
        sha = described.get("prompt_sha256")
        if text is None or hashlib.sha256(text.encode()).hexdigest() != sha:
            continue
        name = prompt_registry_name(group, described)
        entries[group] = {"name": name, "sha256": sha, "version": None}
        texts[group] = text
    outcome = components["reward"].get("outcome")
    if outcome is not None:  # the outcome judge's prompts (or rule), under reward.tool_reward
        from slca_exp.judges import outcome_prompts

        for role, text in outcome_prompts(config.reward, config.judge).items():
            # the fallback prompt is named and hashed under its own keys
            own = {"prompt": outcome.get("fallback_prompt"), "backend": outcome["backend"]}
            described = own if role == "outcome_fallback" else outcome
            sha = outcome.get("fallback_prompt_sha256" if described is own else "prompt_sha256")
            if hashlib.sha256(text.encode()).hexdigest() != sha:
                continue
            name = prompt_registry_name("outcome", described)
            entries[role] = {"name": name, "sha256": sha, "version": None}
            texts[role] = text
    return entries, texts


def data_of(config: RunConfig, problems: list[Problem]) -> dict[str, Any]:
    """Each split's path, sha256 and row count; every row is checked (``data/rows.py``).

    The data source of ``data.kind`` adds what it records (``data/sources.py``). A source that
    makes its split (the synthetic one: deterministic, well under a second for hundreds of rows)
    makes it first when it is missing, except when another component already failed: a refused
    recipe creates nothing. Files a source does not make are checked in any case, so that every
    problem is reported at once.
    """
    from slca_exp.core.checking import may_create
    from slca_exp.data.sources import data_source
    from slca_exp.data.splits import DataError, recorded_files

    d = config.data
    source = data_source(d.kind)
    out: dict[str, Any] = {"name": d.name, "kind": d.kind, "seed": d.seed, "files": {}}
    out.update(source.recorded(config))
    if source.generates and (problems or not may_create()):
        # Making the split would create files for a recipe that is refused anyway, or during a
        # check that only looks (validate, --dry-run: the split "will be generated").
        return out
    try:
        out["files"] = recorded_files(config)
    except DataError as err:
        problems.extend(err.problems)
    return out


def plain(obj: Any) -> Any:  # noqa: ANN401
    """A dataclass as a dict; anything else as it is."""
    return asdict(obj) if is_dataclass(obj) else obj
