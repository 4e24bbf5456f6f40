"""What field checks cannot see: each section's cross-field checks and the registries' names.

``judge.backend``, ``simulator.backend``, ``data.kind`` and ``tracking.backends`` are checked
against their registries, plugins' entries included (:func:`unregistered_names`); each section
has its cross-field check in :data:`CROSS_CHECKS` (tool weights summing to 1, a judge that asks a
server needing a model, credentials kept out of URIs, ...).
"""

from __future__ import annotations

import math
import re
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from slca_exp.core.problems import Problem
from slca_exp.registry import Registry
from slca_exp.services.definition import NAME_PATTERN
from slca_exp.services.served import SERVED_OPTION

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_reward(reward: DictConfig) -> list[Problem]:
    """The tool weights sum to 1, or ``normalize`` rescales them, or all five are 0.

    All five at 0 (with ``normalize=false``) is the "w/o HierR" ablation (``ablation=no_hierr``):
    R_tool is 0 on every rollout that calls a tool, so only the summary reward (and the no-call
    penalty) trains the policy, while HierR is still computed and logged; the public code's
    ablation sets its five weights to 0 the same way.
    """
    weights = reward.tool_weights
    total = sum(float(weights[k]) for k in weights)
    if reward.normalize:
        if total <= 0:
            return [
                Problem(
                    "reward.tool_weights",
                    "normalize=true needs at least one positive tool weight (they sum to 0)",
                    "give some weight a positive value",
                )
            ]
        return []
    if all(float(weights[k]) == 0 for k in weights):
        return []
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        return [
            Problem(
                "reward.tool_weights",
                f"the five tool weights must sum to 1 (they sum to {total:g})",
                "adjust them, or set reward.normalize=true to rescale (the rescaled weights "
                "are recorded)",
            )
        ]
    return []


def outcome_problems(cfg: DictConfig) -> list[Problem]:
    """The outcome judge's checks (``reward.tool_reward=outcome``), across reward and judge.

    Its backend must be registered (or ``auto``); one that asks a server asks the summary
    judge's, so ``judge.backend`` must ask one too; its prompt files must exist.
    """
    reward = cfg.get("reward")
    if reward is None or reward.get("tool_reward") != "outcome" or "outcome" not in reward:
        return []
    from slca_exp.judges.outcome import OUTCOME_JUDGES, PROMPT_GROUP, outcome_backend
    from slca_exp.services.prompts import resolve_prompt, shipped_prompts

    outcome, judge = reward.outcome, cfg.get("judge")
    judge_backend = str(judge.backend) if judge is not None else ""
    judge_remote = is_remote("judge", judge_backend)
    backend = outcome_backend(outcome, judge_remote)
    problems = []
    if backend not in OUTCOME_JUDGES:
        problems.append(
            Problem(
                "reward.outcome.backend",
                OUTCOME_JUDGES.unknown_message(backend),
                f"use auto or any of: {', '.join(OUTCOME_JUDGES.names())}; a plugin module "
                "named in $SLCA_EXP_PLUGINS adds its own "
                "(slca_exp.judges.outcome.OUTCOME_JUDGES.register)",
            )
        )
    elif OUTCOME_JUDGES.get(backend).remote and not judge_remote:
        problems.append(
            Problem(
                "reward.outcome.backend",
                f"{backend} asks the summary judge's server, and judge.backend={judge_backend} "
                "asks none",
                "serve the judge (judge=openai with judge.model and judge.base_url, or "
                "judge.service=<name>): both judges then ask it; or use "
                "reward.outcome.backend=facts (CPU, rows that record their gold answers)",
            )
        )
    for key in ("prompt", "fallback_prompt"):
        given = outcome.get(key)
        if given and resolve_prompt(str(given), PROMPT_GROUP) is None:
            shipped = ", ".join(shipped_prompts(PROMPT_GROUP))
            problems.append(
                Problem(
                    f"reward.outcome.{key}",
                    f"no prompt template {given!r}: neither a file nor a template shipped in "
                    "slca_exp/judges/prompts/outcome/",
                    f"give the path of a template file, or one of: {shipped}",
                )
            )
    return problems


SERVICES = ("judge", "simulator")
"""The config groups of the frozen models a run asks; each names its backend in a registry."""


def registries() -> dict[str, tuple[str, Registry[Any]]]:
    """Each key whose value names registry entries -> where its registry is, and the registry."""
    from slca_exp.data.sources import DATA_SOURCES
    from slca_exp.judges import JUDGES
    from slca_exp.simulators import SIMULATORS
    from slca_exp.tracking.build import TRACKERS

    return {
        "judge.backend": ("slca_exp.judges.JUDGES", JUDGES),
        "simulator.backend": ("slca_exp.simulators.SIMULATORS", SIMULATORS),
        "data.kind": ("slca_exp.data.sources.DATA_SOURCES", DATA_SOURCES),
        "tracking.backends": ("slca_exp.tracking.TRACKERS", TRACKERS),
    }


def unregistered_names(cfg: DictConfig) -> list[Problem]:
    """A problem for each name that no registry entry answers to (``judge.backend=rubrik``).

    The message is the registry's own (the known names, the closest one); the fix says how a
    plugin adds an entry. A list (``tracking.backends``) is checked item by item.
    """
    problems = []
    for key, (where, registry) in registries().items():
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        if value is None:
            continue  # not there, or missing (the structure pass reports that)
        named = (
            [(f"{key}[{i}]", v) for i, v in enumerate(value)]
            if isinstance(value, ListConfig)
            else [(key, value)]
        )
        for full, name in named:
            if name not in registry:
                problems.append(
                    Problem(
                        full,
                        registry.unknown_message(name),
                        f"use any of: {', '.join(registry.names())}; a plugin module named in "
                        f"$SLCA_EXP_PLUGINS adds its own ({where}.register)",
                    )
                )
    return problems


def service_backends(group: str) -> Registry[Any]:
    """The registry of a service group's backends (``JUDGES`` or ``SIMULATORS``)."""
    return registries()[f"{group}.backend"][1]


def is_remote(group: str, backend: str) -> bool:
    """Whether the ``group`` backend ``backend`` asks a server (``False``: unknown or local)."""
    backends = service_backends(group)
    return backend in backends and bool(backends.get(backend).remote)


_SECRET_QUERY = re.compile(
    r"[?&](?P<name>[^=&#]*(?:key|token|secret|passw(?:or)?d|sig(?:nature)?|auth)[^=&#]*)=",
    re.IGNORECASE,
)


def url_credentials(url: str) -> str | None:
    """What in ``url`` is a credential (``user:password@``, ``?api_key=...``), or ``None``.

    Example:
        >>> url_credentials("http://u:secret@host/v1"), url_credentials("http://host/v1?token=x")
        ('user:password@', 'the query parameter token')
        >>> url_credentials("http://127.0.0.1:8000/v1") is None
        True

    """
    match = _URI.match(url)
    if match is not None and match.group("auth"):
        return "user:password@"
    query = _SECRET_QUERY.search(url)
    return f"the query parameter {query.group('name')}" if query else None


_SERVED_OPTION = {"judge": "judge=openai", "simulator": "simulator=sgls"}
"""The shipped option of each group whose backend asks a served model."""


def _check_service(group: str) -> Any:  # noqa: ANN401
    def check(service: DictConfig) -> list[Problem]:
        problems = []
        key_env = service.api_key_env
        if key_env and not _ENV_NAME.fullmatch(str(key_env)):
            problems.append(
                Problem(
                    f"{group}.api_key_env",
                    "must be the NAME of an environment variable holding the key, not the key",
                    f"export the key as e.g. MY_API_KEY and set {group}.api_key_env=MY_API_KEY",
                )
            )
        if service.prompt:
            from slca_exp.services.prompts import resolve_prompt, shipped_prompts

            if resolve_prompt(str(service.prompt), group) is None:
                shipped = ", ".join(shipped_prompts(group)) or "(none)"
                problems.append(
                    Problem(
                        f"{group}.prompt",
                        f"no prompt template {service.prompt!r}: neither a file nor a template "
                        f"shipped in slca_exp/{group}s/prompts/",
                        f"give the path of a template file, or one of: {shipped}",
                    )
                )
        url = str(service.base_url or "")  # checked whatever the backend: it is recorded
        secret = url_credentials(url) if url else None
        if secret is not None:
            problems.append(
                Problem(
                    f"{group}.base_url",
                    f"carries credentials ({secret}); configs are recorded, secrets must not be",
                    f"remove them from the URL, export the key as e.g. MY_API_KEY and set "
                    f"{group}.api_key_env=MY_API_KEY (it is sent as Authorization: Bearer)",
                )
            )
        backends = service_backends(group)
        local = " | ".join(n for n in backends.names() if not backends.get(n).remote)
        if service.service and not is_remote(group, service.backend):
            problems.append(
                Problem(
                    f"{group}.service",
                    f"{group}.backend={service.backend} asks no server, so it cannot use the "
                    f"service {service.service!r}",
                    f"pick {group}={SERVED_OPTION} (the model the service serves), or "
                    f"{_SERVED_OPTION[group]} with {group}.model=<the model it serves>, or set "
                    f"{group}.service=null",
                )
            )
        rubric_v1 = service.get("rubric_version") == "v1"
        if group == "judge" and service.backend != "rubric" and rubric_v1:
            problems.append(
                Problem(
                    "judge.rubric_version",
                    f"picks the rubric judge's rule, but judge.backend={service.backend} is not "
                    "the rubric judge",
                    "drop judge.rubric_version=v1, or pick judge=rubric",
                )
            )
        if service.service and not NAME_PATTERN.fullmatch(str(service.service)):
            problems.append(
                Problem(
                    f"{group}.service",
                    f"{service.service!r} is not a service's registry name (letters, digits, "
                    "_ . -)",
                    "give the name `slca-exp serve status` lists",
                )
            )
        if not is_remote(group, service.backend):
            return problems
        for key, example in (("model", "my-model"), ("base_url", "http://127.0.0.1:8000/v1")):
            if service.service:
                continue  # the service's record gives both (the model when not given)
            if not service[key]:
                problems.append(
                    Problem(
                        f"{group}.{key}",
                        f"{group}.backend={service.backend} talks to a served model and needs "
                        f"{group}.{key}",
                        f"set {group}.{key}={example}, name a service started with `slca-exp "
                        f"serve up` ({group}.service=<its name>), or use {group}.backend={local}",
                    )
                )
        if url and not url.startswith(("http://", "https://")):
            problems.append(
                Problem(
                    f"{group}.base_url",
                    f"must be an http:// or https:// URL of an OpenAI-compatible API (got {url!r})",
                    f"set {group}.base_url=http://<host>:<port>/v1",
                )
            )
        return problems

    return check


def _check_backbone(backbone: DictConfig) -> list[Problem]:
    from slca_exp.backbones.checks import config_problems

    return config_problems(backbone)


def _check_data(data: DictConfig) -> list[Problem]:
    """The data source's own problems with the ``data`` config (``data/sources.py``)."""
    from slca_exp.data.sources import DATA_SOURCES

    if data.kind not in DATA_SOURCES:
        return []  # reported by unregistered_names
    return DATA_SOURCES.get(data.kind).problems(data)


def _check_algorithm(algorithm: DictConfig) -> list[Problem]:
    from slca_exp.estimators import ESTIMATORS

    if algorithm.name not in ESTIMATORS:
        return [
            Problem(
                "algorithm.name",
                ESTIMATORS.unknown_message(algorithm.name),
                "pick a registered estimator, e.g. algorithm=slca_grpo",
            )
        ]
    return []


_URI = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?://(?P<auth>[^/@]*@)?)?")


def _check_tracking(tracking: DictConfig) -> list[Problem]:
    problems = []
    _, trackers = registries()["tracking.backends"]
    seen = [name for name in tracking.backends if name in trackers]
    if len(set(seen)) < len(seen):
        problems.append(
            Problem("tracking.backends", "lists a tracker twice", "name each tracker once")
        )
    uri = tracking.get("mlflow_uri")
    if uri:
        match = _URI.match(str(uri))
        if match is None:
            problems.append(
                Problem(
                    "tracking.mlflow_uri",
                    f"{uri!r} is not a URI (no scheme)",
                    "give e.g. http://127.0.0.1:5000 or sqlite:////abs/path/mlflow.db, or null "
                    "for the default store under tracking.root",
                )
            )
        elif (secret := url_credentials(str(uri))) is not None:
            problems.append(
                Problem(
                    "tracking.mlflow_uri",
                    f"carries credentials ({secret}); configs are recorded, secrets must not be",
                    "remove them from the URI and export MLFLOW_TRACKING_USERNAME and "
                    "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) instead",
                )
            )
    return problems


def _check_engine(engine: DictConfig) -> list[Problem]:
    from slca_exp.engines import ENGINES

    if engine.name not in ENGINES:
        return [
            Problem(
                "engine.name",
                ENGINES.unknown_message(engine.name),
                "pick an installed engine, e.g. engine=local (plugins add theirs through "
                "SLCA_EXP_PLUGINS)",
            )
        ]
    rollout = engine.rollout
    if rollout.max_response_tokens < rollout.max_turn_tokens:
        return [
            Problem(
                "engine.rollout.max_response_tokens",
                f"{rollout.max_response_tokens} tokens cannot hold even one assistant turn "
                f"(engine.rollout.max_turn_tokens={rollout.max_turn_tokens})",
                "raise engine.rollout.max_response_tokens to at least "
                "engine.rollout.max_turn_tokens (a tool call, its response and a reply need "
                "about three turns' worth)",
            )
        ]
    if not (engine.sft.enabled or engine.rl.enabled):
        return [
            Problem(
                "engine.rl.enabled",
                "both stages are off (engine.sft.enabled=false, engine.rl.enabled=false)",
                "enable at least one stage",
            )
        ]
    return []


def _check_simulator(simulator: DictConfig) -> list[Problem]:
    problems = _check_service("simulator")(simulator)
    if simulator.schema_guidance or not simulator.prompt or problems:
        return problems
    from slca_exp.services.prompts import PromptTemplate

    template = PromptTemplate.load(str(simulator.prompt), "simulator")
    if "schema" in template.fields:
        problems.append(
            Problem(
                "simulator.prompt",
                f"{simulator.prompt!r} shows the tool's schema ({{{{schema}}}}), but "
                "simulator.schema_guidance=false gives the simulator none",
                "set simulator.prompt=sgls_no_schema_v1.txt (or a template without {{schema}}), "
                "or simulator.schema_guidance=true",
            )
        )
    return problems


CROSS_CHECKS = {
    "backbone": _check_backbone,
    "reward": _check_reward,
    "judge": _check_service("judge"),
    "simulator": _check_simulator,
    "data": _check_data,
    "algorithm": _check_algorithm,
    "engine": _check_engine,
    "tracking": _check_tracking,
}
