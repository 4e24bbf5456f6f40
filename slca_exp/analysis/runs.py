"""Which runs ``slca-exp compare`` compares, how it groups them, and one number per run.

A sweep id, a parent run id or an experiment name is a :class:`Selection` (:func:`find_runs`);
runs that differ only in the seed are one group (:func:`group_runs`); an :class:`Observations`
is a metric's final value, or a per-step diagnostic's mean over the steps.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from slca_exp.analysis.estimates import MEAN_OVER_STEPS
from slca_exp.core.tags import COPY_OF, PARENT_ROLE, ROLE, SWEEP, SWEPT, SWEPT_PREFIX, swept_tag
from slca_exp.tracking import sweep_runs
from slca_exp.tracking.mlflow import mlflow_key
from slca_exp.tracking.readback import get_run, looks_like_run_id

SEED_KEYS = ("seed",)
"""Swept keys whose values are repetitions (averaged over, paired on), not factors."""
_VOLATILE_PARAMS = ("run_name",)


class CompareError(Exception):
    """A user-facing error: an unknown target, or a refusal of the guard; exit status 2."""


@dataclass
class Selection:
    """The runs to compare.

    Attributes:
        label: what was found, for messages ("sweep X (parent run Y)" or "experiment X").
        runs: the runs, oldest first.
        swept: the keys the sweep varied (from the parent's ``slca.swept`` tag, or the runs'
            ``slca.swept.<key>`` tags).
        experiment_ids: the experiments the runs live in (for the UI URL).

    """

    label: str
    runs: list[Any]
    swept: list[str]
    experiment_ids: list[str] = field(default_factory=list)


def find_runs(client: Any, target: str) -> Selection:
    """Resolve a sweep id, a parent run id or an experiment name to its runs.

    Raises:
        CompareError: nothing of that name, or it has no runs.

    """
    experiments = client.search_experiments()
    ids = [e.experiment_id for e in experiments]
    quoted = target.replace("'", "\\'")
    parents = sweep_runs.search_all(client, ids, f"tags.`{SWEEP}` = '{quoted}'")
    parents = [p for p in parents if p.data.tags.get(ROLE) == PARENT_ROLE]
    if not parents and looks_like_run_id(target):
        parents = [run for run in [get_run(client, target)] if run is not None]
    if parents:
        parent = parents[-1]  # the newest, if a sweep id was reused
        runs = sweep_runs.children(client, parent.info.experiment_id, parent.info.run_id)
        swept = json.loads(parent.data.tags.get(SWEPT, "[]"))
        label = f"sweep {parent.data.tags.get(SWEEP, '?')} (parent run {shown_id(parent)})"
        if not runs:
            raise CompareError(f"{label} has no child runs yet; did its jobs log to MLflow?")
        return Selection(label, runs, swept, [parent.info.experiment_id])
    experiment = next((e for e in experiments if e.name == target), None)
    if experiment is None:
        names = ", ".join(sorted(e.name for e in experiments)) or "(none)"
        raise CompareError(
            f"no sweep id, parent run id or experiment named {target!r} in {client.tracking_uri}. "
            f"Experiments: {names}. Sweep ids are the parent runs' {SWEEP} tags "
            "(pass --tracking-uri if the runs are in another store)."
        )
    runs = [
        run
        for run in sweep_runs.search_all(client, [experiment.experiment_id])
        if run.data.tags.get(ROLE) != PARENT_ROLE
    ]
    if not runs:
        raise CompareError(f"experiment {target!r} has no runs")
    swept = sorted(
        {k[len(SWEPT_PREFIX) :] for r in runs for k in r.data.tags if k.startswith(SWEPT_PREFIX)}
    )
    return Selection(f"experiment {target}", runs, swept, [experiment.experiment_id])


def group_runs(selection: Selection) -> dict[tuple, list[Any]]:
    """The runs grouped as the table rows them: by swept values other than the seed.

    Runs that also differ in an unswept param stay apart (the comparability guard names it).
    """
    keys = [k for k in selection.swept if k not in SEED_KEYS]
    groups: dict[tuple, list[Any]] = {}
    for run in selection.runs:
        groups.setdefault(_group_key(run, keys), []).append(run)
    return groups


def _group_key(run: Any, keys: Sequence[str]) -> tuple:
    ignored = set(SEED_KEYS) | set(_VOLATILE_PARAMS)
    params = tuple(sorted((k, v) for k, v in run.data.params.items() if k not in ignored))
    return tuple(swept_value(run, k) for k in keys) + params


def group_labels(selection: Selection) -> dict[str, list[Any]]:
    """A unique legend label -> the runs of one group (:func:`group_runs`).

    The label is the group's swept values other than the seed, with the number of runs when
    there are several; a run alone in its group without swept values is named after its run.
    """
    keys = [k for k in selection.swept if k not in SEED_KEYS]
    labelled: dict[str, list[Any]] = {}
    for runs in group_runs(selection).values():
        first = runs[0]
        text = " ".join(f"{k}={swept_value(first, k)}" for k in keys)
        if len(runs) > 1:
            text = f"{text} (n={len(runs)})".strip()
        text = text or first.info.run_name or ""
        if not text or text in labelled:
            text = f"{text} [{first.info.run_id[:8]}]".strip()
        labelled[text] = runs
    return labelled


def compare_url(ui_url: str, selection: Selection) -> str:
    """The MLflow UI's compare page for the selected runs (query values percent-encoded)."""
    runs = json.dumps([r.info.run_id for r in selection.runs], separators=(",", ":"))
    experiments = json.dumps(selection.experiment_ids, separators=(",", ":"))
    query = f"runs={quote(runs, safe='')}&experiments={quote(experiments, safe='')}"
    return f"{ui_url.rstrip('/')}/#/compare-runs?{query}"


def swept_value(run: Any, key: str) -> str:  # noqa: ANN401
    """A run's value of a swept key: its ``slca.swept.<key>`` tag, else its param."""
    tags, params = run.data.tags, run.data.params
    return tags.get(swept_tag(key), params.get(key, ""))


def shown_id(run: Any) -> str:  # noqa: ANN401
    """The run's id; for a run loaded from a study file, the id it had when the file was saved."""
    return run.data.tags.get(COPY_OF, run.info.run_id)


def seed_of(run: Any) -> str:  # noqa: ANN401
    """A run's seed: its swept value, else its param (``?`` when it has neither)."""
    return swept_value(run, "seed") or run.data.params.get("seed", "?")


class Observations:
    """One number per (run, metric), read from the store once."""

    def __init__(self, client: Any) -> None:  # noqa: ANN401
        self.client = client
        self._cache: dict[tuple[str, str], float | None] = {}
        self._final_val: dict[str, tuple[int, list[Any]] | None] = {}

    def __call__(self, run: Any, metric: str) -> float | None:  # noqa: ANN401
        """The run's observation of ``metric``; ``None`` when it has none."""
        key = (run.info.run_id, metric)
        if key not in self._cache:
            self._cache[key] = self._read(run, metric)
        return self._cache[key]

    def final_val(self, run: Any) -> tuple[int, list[Any]] | None:  # noqa: ANN401
        """The step and records of the run's last logged validation rollouts, read once.

        ``None`` when the run logged none (``tracking.rollouts.val``). The variance split, the
        report's moved prompts and the study file all read these.
        """
        from slca_exp.tracking import readback

        run_id = run.info.run_id
        if run_id not in self._final_val:
            steps = readback.logged_steps(self.client, run_id, "val")
            self._final_val[run_id] = (
                (
                    steps[-1],
                    readback.download_records(self.client.tracking_uri, run_id, "val", steps[-1]),
                )
                if steps
                else None
            )
        return self._final_val[run_id]

    def final_val_records(self, run: Any) -> list[Any]:  # noqa: ANN401
        """The records of :meth:`final_val` (empty when the run logged none)."""
        found = self.final_val(run)
        return found[1] if found is not None else []

    def _read(self, run: Any, metric: str) -> float | None:  # noqa: ANN401
        name = mlflow_key(metric)
        if name not in run.data.metrics:
            return None
        if metric in MEAN_OVER_STEPS:
            history = self.client.get_metric_history(run.info.run_id, name)
            values = [m.value for m in history if math.isfinite(m.value)]
            return math.fsum(values) / len(values) if values else None
        value = float(run.data.metrics[name])
        return value if math.isfinite(value) else None
