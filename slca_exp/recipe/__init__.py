"""The recipe: the five components every number must travel with, their hashes and a fingerprint.

Backbone, reward, judge, simulator and data split are recorded as one block,
with the algorithm, the engine and the code version beside them. The fingerprint is the sha256 of
the canonical JSON of the five components only, so runs that sweep the estimator or the seed over
one recipe share it, and two runs with different fingerprints differ in a recorded component.

Everything that could make the recipe incomplete (a data file or a prompt that is not there, a
local backbone folder that does not exist) is found here (``components.py``), before any run or
folder is created, and reported as one :class:`~slca_exp.preflight.validate.ConfigError` naming
the keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from slca_exp.config.schema import RunConfig
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
from slca_exp.recipe import components as component

COMPONENTS = ("backbone", "reward", "judge", "simulator", "data")
"""The five recorded components, in the order the paper lists them."""

PACKAGES = ("slca-exp", "torch", "verl", "vllm", "mlflow", "wandb")
"""Packages whose installed versions are recorded (None when not installed)."""

SWEEP_ID_ENV = "SLCA_EXP_SWEEP_ID"
"""Set by the sweep callback for every job of a multirun; recorded as the ``slca.sweep`` tag."""


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
            ``name`` (stable, ``components.prompt_registry_name``), ``sha256`` (the component's
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
            JUDGE: service_tag(self.judge),
            SIMULATOR: service_tag(self.simulator),
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
        "backbone": component.backbone_of(config, problems),
        "reward": component.reward_of(config),
        "judge": component.service_of("judge", config.judge, problems, served.get("judge")),
        "simulator": component.service_of(
            "simulator", config.simulator, problems, served.get("simulator")
        ),
        "data": component.data_of(config, problems),
    }
    if problems:
        raise ConfigError(problems)
    prompts, texts = component.prompts_of(config, components)
    return Recipe(
        **components,
        algorithm=component.plain(config.algorithm),
        engine=component.plain(config.engine),
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
    sha, dirty = _git_state(Path(__file__).resolve().parents[2])
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {"git_sha": sha, "git_dirty": dirty, "packages": packages}


# --- tags and helpers --------------------------------------------------------------------------


def _backbone_tag(b: dict[str, Any]) -> str:
    if b["source"] == "builtin":
        return f"builtin:{b['name']}"
    ref = b["path"] or b["name"]
    return f"{b['source']}:{ref}" + (f"@{str(b['revision'])[:12]}" if b.get("revision") else "")


def service_tag(s: dict[str, Any]) -> str:
    """A judge's or simulator's tag (``backend[:model][@prompt version]``) from its component."""
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
