"""The comparability guard of ``slca-exp compare``: runs share every component not swept.

Each run records five components (``slca_exp.recipe.COMPONENTS``: backbone, reward, judge,
simulator, data) in ``recipe.json`` and as short ``slca.<component>`` tags. Runs with one
``slca.fingerprint`` share all five; otherwise the components are compared one by one (from
``recipe.json``, else from the tags and, for the data split, the run's MLflow dataset inputs).
A component counts as swept when a swept key lies under it (``judge.model``, ``judge=llm``) or
the sweep varied ``experiment``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slca_exp.core import tags
from slca_exp.recipe import COMPONENTS
from slca_exp.tracking.lineage import run_datasets
from slca_exp.tracking.sweep_runs import no_progress_bar

_HASH_SUFFIXES = ("_sha256", "_hash", "sha256")
"""Fields left out of the short value labels (still listed among the differing fields)."""


@dataclass
class Difference:
    """Runs that differ in one recipe component that was not swept."""

    component: str
    values: dict[str, list[str]]
    """A short label of the component's value (its tag and differing fields) -> run ids."""
    fields: list[str]
    """The differing fields inside the component (``judge.model``), when recipe.json is logged."""

    def message(self) -> str:
        """One line naming the component, the values and the fields."""
        values = "; ".join(
            f"{v!r} in {len(r)} run{'' if len(r) == 1 else 's'} ({', '.join(_short(r))})"
            for v, r in self.values.items()
        )
        where = f" (differing fields: {', '.join(self.fields[:5])})" if self.fields else ""
        return f"runs differ in {self.component}, which was not swept: {values}{where}"


def swept_components(swept: Sequence[str]) -> set[str]:
    """The recipe components a sweep varied (``judge.model`` -> judge; ``experiment`` -> all)."""
    found: set[str] = set()
    for key in swept:
        head = key.split(".", 1)[0].split("@", 1)[0]
        if head == "experiment":
            return set(COMPONENTS)
        if head in COMPONENTS:
            found.add(head)
    return found


def differences(client: Any, runs: Sequence[Any], swept: Sequence[str]) -> list[Difference]:
    """Recipe components that differ between ``runs`` and are not varied by a ``swept`` key."""
    prints = {run.data.tags.get(tags.FINGERPRINT) for run in runs}
    if len(prints) == 1 and None not in prints:
        return []  # one fingerprint: the five components are identical
    recipes = {run.info.run_id: _recipe_components(client, run) for run in runs}
    skip = swept_components(swept)
    found = []
    for component in COMPONENTS:
        if component in skip:
            continue
        comps = {rid: rec.get(component) for rid, rec in recipes.items()}
        if len({json.dumps(c, sort_keys=True, default=str) for c in comps.values()}) <= 1:
            continue
        fields = _differing_fields(component, list(comps.values()))
        shown = [f for f in fields if not f.endswith(_HASH_SUFFIXES)][:3]
        values: dict[str, list[str]] = {}
        for run in runs:
            rid = run.info.run_id
            label = run.data.tags.get(tags.COMPONENT_TAGS[component]) or json.dumps(comps[rid])
            if shown:  # a tag is short: also show what differs (``min_reply_chars=20``)
                parts = [f"{f.split('.', 1)[1]}={_field(comps[rid], f)}" for f in shown]
                label += f" ({', '.join(parts)})"
            values.setdefault(label, []).append(rid)
        found.append(Difference(component, values, fields))
    return found


def changed_fields(client: Any, run: Any, components: dict[str, Any]) -> list[str]:  # noqa: ANN401
    """Where ``run``'s recorded components differ from ``components`` (``Recipe.components``).

    Dotted fields (``data.files.sft.sha256``); data file paths are left out, as the
    fingerprint leaves them out.
    """
    recorded = _recipe_components(client, run)
    found: list[str] = []
    for component in COMPONENTS:
        pair = [
            _portable(component, recorded.get(component)),
            _portable(component, components.get(component)),
        ]
        if pair[0] != pair[1]:
            found += _differing_fields(component, pair) or [component]
    return found


def _portable(component: str, value: Any) -> Any:  # noqa: ANN401 - any JSON value
    """``value`` as the fingerprint reads it: a data split's file paths left out."""
    if (
        component != "data"
        or not isinstance(value, dict)
        or not isinstance(value.get("files"), dict)
    ):
        return json.loads(json.dumps(value, default=str))
    files = {r: {k: v for k, v in e.items() if k != "path"} for r, e in value["files"].items()}
    return json.loads(json.dumps({**value, "files": files}, default=str))


def _recipe_components(client: Any, run: Any) -> dict[str, Any]:
    """The five components from the run's recipe.json, else its ``slca.*`` tags.

    Without recipe.json the data split is read from the run's MLflow dataset inputs (split name
    -> digest) when it has them: they name the files' contents, the tag only their origin.
    """
    try:
        import mlflow

        with no_progress_bar():
            recipe = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/recipe.json")
        return {c: recipe[c] for c in COMPONENTS if c in recipe}
    except Exception:  # no recipe.json (older run, logged by another tool): compare tags
        found = {c: run.data.tags.get(tags.COMPONENT_TAGS[c]) for c in COMPONENTS}
        splits = run_datasets(run)
        if splits:
            found["data"] = splits
        return found


def _field(component: Any, dotted: str) -> Any:  # noqa: ANN401 - any JSON value
    """The value at ``judge.model`` inside a component dict (the first part names it)."""
    value = component
    for part in dotted.split(".")[1:]:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _differing_fields(prefix: str, values: list[Any]) -> list[str]:
    if not all(isinstance(v, dict) for v in values):
        return []
    keys = sorted({k for v in values for k in v})
    out: list[str] = []
    for key in keys:
        sub = [v.get(key) for v in values]
        if any(s != sub[0] for s in sub):
            nested = _differing_fields(f"{prefix}.{key}", sub)
            out += nested or [f"{prefix}.{key}"]
    return out


def _short(run_ids: list[str]) -> list[str]:
    return [r[:8] for r in run_ids[:4]] + (["..."] if len(run_ids) > 4 else [])
