"""The runs of a sweep in MLflow: finding them by the tags that tie them, the summary table.

Shared by the sweep callback (``launch/sweep.py``) and ``slca-exp compare``; the tags are
defined in ``core/tags.py``.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from slca_exp.core import names
from slca_exp.core.names import METRICS
from slca_exp.core.process import env_set
from slca_exp.core.tags import JOB, JOB_STATUS, OVERRIDES, PARENT_RUN, SUPERSEDED_BY
from slca_exp.recipe import SWEEP_ID_ENV
from slca_exp.tracking.mlflow import PARENT_RUN_ENV

ENV_PARENT_RUN_ID = PARENT_RUN_ENV
"""Env var: the sweep's parent run id, read by the MLflow tracker inside each job."""
ENV_SWEEP_ID = SWEEP_ID_ENV
"""Env var: the sweep id (tag ``slca.sweep``, W&B group), read by the recipe inside each job."""

HEADLINE_METRICS: tuple[str, ...] = (
    names.REWARD_TOTAL_MEAN,
    names.REWARD_TOOL_MEAN,
    names.REWARD_SUMMARY_MEAN,
    names.VAL_SUCCESS,
)
"""Metrics shown by default in summaries and ``slca-exp compare`` (when a run logged them)."""
_unknown = [m for m in HEADLINE_METRICS if m not in METRICS]
if _unknown:  # names.py is the single source of metric names
    raise ValueError(f"HEADLINE_METRICS names metrics missing from core/names.py: {_unknown}")

FAILED_RUN_STATES = ("FAILED", "KILLED")


@contextmanager
def no_progress_bar() -> Iterator[None]:
    """Silence MLflow's artifact download progress bar for the duration of the block."""
    with env_set("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"):
        yield


def split_overrides(overrides: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Split Hydra task overrides into ``(swept, fixed)``, each key -> value string.

    >>> split_overrides(["algorithm=grpo,slca_grpo", "seed=3", "+x=1"])
    ({'algorithm': 'grpo,slca_grpo'}, {'seed': '3', 'x': '1'})
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    swept: dict[str, str] = {}
    fixed: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.is_delete():
            continue
        target = swept if override.is_sweep_override() else fixed
        target[override.key_or_group] = str(override.get_value_string())
    return swept, fixed


def search_all(client: Any, experiment_ids: Sequence[str], filter_string: str = "") -> list[Any]:
    """Every run matching ``filter_string`` in the experiments, oldest first (all pages)."""
    runs: list[Any] = []
    token = None
    while True:
        page = client.search_runs(
            list(experiment_ids),
            filter_string=filter_string,
            max_results=1000,
            order_by=["attributes.start_time ASC"],
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def children(
    client: Any, experiment_id: str | None, parent_run_id: str, *, superseded: bool = False
) -> list[Any]:
    """The child runs of ``parent_run_id`` (tag ``mlflow.parentRunId``), oldest first.

    A run whose job a later attempt of the sweep ran again (tag ``slca.superseded_by``) is left
    out unless ``superseded``: the sweep's result is each job's latest run.
    """
    if experiment_id is None:
        experiment_id = client.get_run(parent_run_id).info.experiment_id
    runs = search_all(client, [experiment_id], f"tags.`{PARENT_RUN}` = '{parent_run_id}'")
    return [r for r in runs if superseded or SUPERSEDED_BY not in r.data.tags]


def find_child(
    client: Any,
    experiment_id: str | None,
    parent_run_id: str,
    start_ms: int,
    overrides: Sequence[str],
    run_name: str | None = None,
) -> Any | None:
    """The child run that the job started at ``start_ms`` with ``overrides`` created, or None.

    Candidates are children not yet claimed by a job (no ``slca.job`` tag) started after the job
    did. Among several (parallel jobs): the run this process last started through MLflow's fluent
    API, else the one called ``run_name`` (default: the job's overrides joined as the tracker
    names runs, ``tracking/build.py``), else the one whose params agree with the job's value
    overrides.
    """
    fresh = [
        run
        for run in children(client, experiment_id, parent_run_id)
        if JOB not in run.data.tags and run.info.start_time >= start_ms - 1000
    ]
    if len(fresh) <= 1:
        return fresh[0] if fresh else None
    last = _fluent_last_run_id()
    for run in fresh:
        if run.info.run_id == last:
            return run
    name = run_name or ",".join(
        sorted(o for o in overrides if not o.lstrip("+~").startswith("hydra"))
    )
    named = [run for run in fresh if run.info.run_name == name]
    if len(named) == 1:
        return named[0]
    _, values = split_overrides(overrides)
    matching = [
        run
        for run in fresh
        if all(_same(run.data.params[k], v) for k, v in values.items() if k in run.data.params)
    ]
    return matching[0] if len(matching) == 1 else None


def _fluent_last_run_id() -> str | None:
    try:
        import mlflow

        run = mlflow.active_run() or mlflow.last_active_run()
    except Exception:  # no fluent run in this process, or another tracking URI
        return None
    return run.info.run_id if run is not None else None


def _same(logged: str, override: str) -> bool:
    """A logged param equals an override value (``0.1`` == ``0.10``, ``True`` == ``true``)."""
    if logged == override or logged.lower() == override.lower():
        return True
    try:
        return float(logged) == float(override)
    except ValueError:
        return False


def summary_rows(jobs: Mapping[int, Mapping[str, Any]], runs: Iterable[Any]) -> list[dict]:
    """One row per job (plus any child no job claimed): run id, overrides, status, final metrics."""
    by_id = {run.info.run_id: run for run in runs}
    rows: list[dict[str, Any]] = []
    for num in sorted(jobs):
        job = jobs[num]
        run = by_id.pop(job.get("run_id") or "", None)
        rows.append(_row(num, " ".join(job.get("overrides", [])), job.get("status", ""), run))
    for run in by_id.values():
        tags = run.data.tags
        rows.append(_row(tags.get(JOB, ""), tags.get(OVERRIDES, ""), tags.get(JOB_STATUS), run))
    return rows


def _row(job: object, overrides: str, status: str | None, run: Any | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "job": job,
        "run_id": run.info.run_id if run else "",
        "overrides": overrides,
        "status": status or "",
        "run_status": run.info.status if run else "NO RUN",
    }
    if run is not None:
        row.update(sorted(run.data.metrics.items()))
    return row


def failed_jobs(jobs: Mapping[int, Mapping[str, Any]], runs: Iterable[Any]) -> list[str]:
    """Jobs that did not complete and child runs that ended FAILED or KILLED, as labels."""
    failed = [f"job {num}" for num, job in jobs.items() if job.get("status") != "COMPLETED"]
    failed += [f"run {run.info.run_id}" for run in runs if run.info.status in FAILED_RUN_STATES]
    return failed


def write_summary(rows: list[dict[str, Any]], folder: Path, name: str) -> list[Path]:
    """Write ``<name>.csv`` (every column) and ``<name>.md`` (headline metrics); return both."""
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    csv_path = folder / f"{name}.csv"
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns or ["job"], restval="")
        writer.writeheader()
        writer.writerows(rows)
    short = [c for c in columns if c not in METRICS or c in HEADLINE_METRICS]
    md_path = folder / f"{name}.md"
    md_path.write_text(markdown_table(short, [[row.get(c, "") for c in short] for row in rows]))
    return [csv_path, md_path]


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub-flavoured markdown table; floats with 4 significant digits.

    >>> print(markdown_table(["a", "b"], [[1, 0.123456]]))
    | a | b |
    | --- | --- |
    | 1 | 0.1235 |
    <BLANKLINE>
    """
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for row in rows:
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
