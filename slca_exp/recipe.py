"""The recipe: the five components every number must travel with, their hashes and a fingerprint.

Backbone, reward, judge, simulator and data split are recorded as one block,
with the algorithm, the engine and the code version beside them. The fingerprint is the sha256 of
the canonical JSON of the five components only, so runs that sweep the estimator or the seed over
one recipe share it, and two runs with different fingerprints differ in a recorded component.

Everything that could make the recipe incomplete (a data file or a prompt that is not there, a
local backbone folder that does not exist) is found here, before any run or folder is created,
and reported as one :class:`~slca_exp.preflight.validate.ConfigError` naming the keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from slca_exp.config.schema import RunConfig, ServiceConfig
from slca_exp.config.weights import normalized_tool_weights
from slca_exp.core.hashing import sha256_file
from slca_exp.core.problems import ConfigError, Problem
from slca_exp.core.tags import (
    BACKBONE,
    DATA,
    ESTIMATOR,
    FINGERPRINT,
    JUDGE,
    REWARD,
    SIMULATOR,
    SWEEP,
)

COMPONENTS = ("backbone", "reward", "judge", "simulator", "data")
"""The five recorded components, in the order the paper lists them."""

PACKAGES = ("slca-exp", "torch", "verl", "vllm", "mlflow", "wandb")
"""Packages whose installed versions are recorded (None when not installed)."""

PROMPTED = ("judge", "simulator")
"""The components whose prompt template (or rule) goes to MLflow's prompt registry (and, under
``reward.tool_reward=outcome``, the outcome judge's: ``outcome``, ``outcome_fallback``)."""

SWEEP_ID_ENV = "SLCA_EXP_SWEEP_ID"
"""Set by the sweep callback for every job of a multirun; recorded as the ``slca.sweep`` tag."""

_HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")
_PROMPT_NAME = re.compile(r"[^\w.-]")


@dataclass(frozen=True)
class Recipe:
    """What a run records about itself (build it with :func:`build_recipe`).

    Attributes:
        backbone, reward, judge, simulator, data: the five components (plain JSON-able dicts).
        algorithm: the estimator and its hyper-parameters.
        engine: where the run executes.
        code: ``git_sha``, ``git_dirty`` (None outside a git checkout) and ``packages`` versions.
        experiment_name: the experiment (MLflow experiment, W&B project).
        seed: the run's seed.
        sweep_id: the multirun this run belongs to (``$SLCA_EXP_SWEEP_ID``), else None.
        fingerprint: sha256 (hex) of the canonical JSON of the five components.
        prompts: ``judge`` / ``simulator`` -> its template in MLflow's prompt registry:
            ``name`` (stable, :func:`prompt_registry_name`), ``sha256`` (the component's
            ``prompt_sha256``) and ``version`` (None until the MLflow tracker registered it). Not
            part of the fingerprint: a version number belongs to one store.
        prompt_texts: the registered texts (not in :meth:`to_dict`; the registry keeps them).
        endpoints: ``judge`` / ``simulator`` -> the URL of the service (``slca-exp serve``) it
            was resolved to at job start. Not part of the fingerprint: the same service may
            answer elsewhere after a restart; its identity is in the component.

    """

    backbone: dict[str, Any]
    reward: dict[str, Any]
    judge: dict[str, Any]
    simulator: dict[str, Any]
    data: dict[str, Any]
    algorithm: dict[str, Any]
    engine: dict[str, Any]
    code: dict[str, Any]
    experiment_name: str
    seed: int
    sweep_id: str | None
    fingerprint: str
    prompts: dict[str, dict[str, Any]] = field(default_factory=dict)
    prompt_texts: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    endpoints: dict[str, str] = field(default_factory=dict)

    @property
    def short_fingerprint(self) -> str:
        """The first 12 hex digits of the fingerprint (tags, run names)."""
        return self.fingerprint[:12]

    def components(self) -> dict[str, dict[str, Any]]:
        """The five components the fingerprint covers."""
        return {name: getattr(self, name) for name in COMPONENTS}

    def to_dict(self) -> dict[str, Any]:
        """Everything but the prompt texts, as a JSON-able dict (written as ``recipe.json``)."""
        out = asdict(self)
        del out["prompt_texts"]
        return out

    def with_prompt_versions(self, versions: dict[str, str]) -> Recipe:
        """A copy with the registry versions of its prompts (``judge`` -> ``"3"``)."""
        prompts = {
            group: {**entry, "version": versions.get(group, entry.get("version"))}
            for group, entry in self.prompts.items()
        }
        return replace(self, prompts=prompts)

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON with sorted keys."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def tags(self) -> dict[str, str]:
        """The ``slca.*`` run tags, short and human-readable."""
        return {
            BACKBONE: _backbone_tag(self.backbone),
            REWARD: f"{self.reward['name']}/{self.reward['variant']}",
            JUDGE: _service_tag(self.judge),
            SIMULATOR: _service_tag(self.simulator),
            DATA: _data_tag(self.data),
            ESTIMATOR: str(self.algorithm["name"]),
            FINGERPRINT: self.short_fingerprint,
            SWEEP: self.sweep_id or "none",
        }


def build_recipe(config: RunConfig, served: Mapping[str, Any] | None = None) -> Recipe:
    """The recipe of a validated config.

    Args:
        config: the validated config.
        served: ``judge`` / ``simulator`` -> the service it was resolved to
            (:func:`slca_exp.services.served.resolve_services`): its identity joins the
            component (and the fingerprint), its endpoint :attr:`Recipe.endpoints`.

    Raises:
        ConfigError: a component cannot be completed (every such problem, each naming its key).

    """
    problems: list[Problem] = []
    served = dict(served or {})
    components = {
        "backbone": _backbone(config, problems),
        "reward": _reward(config),
        "judge": _service("judge", config.judge, problems, served.get("judge")),
        "simulator": _service("simulator", config.simulator, problems, served.get("simulator")),
        "data": _data(config, problems),
    }
    if problems:
        raise ConfigError(problems)
    prompts, texts = _prompts(config, components)
    return Recipe(
        **components,
        algorithm=_plain(config.algorithm),
        engine=_plain(config.engine),
        code=code_versions(),
        experiment_name=config.experiment_name,
        seed=config.seed,
        sweep_id=os.environ.get(SWEEP_ID_ENV) or None,
        fingerprint=fingerprint(components),
        prompts=prompts,
        prompt_texts=texts,
        endpoints={group: found.record.base_url for group, found in served.items()},
    )


def fingerprint(components: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the five components (data file paths left out).

    Data file paths are left out: the same bytes at another path are the same recipe.
    """
    portable = dict(components)
    data = dict(portable["data"])
    data["files"] = {
        role: {k: v for k, v in entry.items() if k != "path"}
        for role, entry in data.get("files", {}).items()
    }
    portable["data"] = data
    canonical = json.dumps(
        {k: portable[k] for k in COMPONENTS}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def code_versions() -> dict[str, Any]:
    """Git sha and dirty flag of the slca-exp checkout (None if not one) and package versions."""
    sha, dirty = _git_state(Path(__file__).resolve().parents[1])
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {"git_sha": sha, "git_dirty": dirty, "packages": packages}


# --- components --------------------------------------------------------------------------------


def _backbone(config: RunConfig, problems: list[Problem]) -> dict[str, Any]:
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
        out["arch"] = _plain(b.arch)
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


def _reward(config: RunConfig) -> dict[str, Any]:
    # Imported here: the rewards pull in torch, which importing the recipe module should not.
    from slca_exp.rewards.hierr import RULES

    r = config.reward
    weights = _plain(r.tool_weights)
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
    }


def _outcome(config: RunConfig) -> dict[str, Any]:
    """``tool_reward`` and the outcome judge's fields, when R_tool is the outcome verdict."""
    if config.reward.tool_reward == "hierr":
        return {}
    from slca_exp.judges import describe_outcome

    return {
        "tool_reward": config.reward.tool_reward,
        "outcome": describe_outcome(config.reward, config.judge),
    }


def _service(
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


def _prompts(
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


def _data(config: RunConfig, problems: list[Problem]) -> dict[str, Any]:
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


# --- tags and helpers --------------------------------------------------------------------------


def _backbone_tag(b: dict[str, Any]) -> str:
    if b["source"] == "builtin":
        return f"builtin:{b['name']}"
    ref = b["path"] or b["name"]
    return f"{b['source']}:{ref}" + (f"@{str(b['revision'])[:12]}" if b.get("revision") else "")


def _service_tag(s: dict[str, Any]) -> str:
    tag = str(s.get("backend") or s.get("name"))
    if s.get("model"):
        tag += f":{s['model']}"
    if s.get("prompt_version"):
        tag += f"@{s['prompt_version']}"
    if isinstance(s.get("service"), dict):  # served by `slca-exp serve`: which service
        tag += f" via {s['service']['name']}@{str(s['service']['fingerprint'])[:12]}"
    return tag


def _data_tag(d: dict[str, Any]) -> str:
    from slca_exp.data.sources import data_source

    return data_source(d["kind"]).tag(d)


def _plain(obj: Any) -> Any:  # noqa: ANN401
    return asdict(obj) if is_dataclass(obj) else obj


def _git_state(folder: Path) -> tuple[str | None, bool | None]:
    if not (folder / ".git").exists():
        return None, None
    try:
        sha = _git(folder, "rev-parse", "HEAD")
        # Untracked files count: a new module changes what runs as much as an edited one.
        dirty = bool(_git(folder, "status", "--porcelain"))
    except (OSError, subprocess.SubprocessError):
        return None, None
    return sha, dirty


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=20, check=True
    ).stdout.strip()
