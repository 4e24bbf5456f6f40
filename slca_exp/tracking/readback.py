"""Reading a run back from its store: the store, a run by id or name, its logged rollouts.

A local store that does not exist is refused (MLflow would create it empty); a step's records
are downloaded into a temporary folder. ``slca-exp rollouts`` and ``compare`` read runs so.
"""

from __future__ import annotations

import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from slca_exp.core.shown import shown_uri
from slca_exp.rollouts.files import RECORDS, artifact_path, folder, read_records, step_of
from slca_exp.rollouts.record import RolloutRecord
from slca_exp.tracking.sweep_runs import no_progress_bar, search_all
from slca_exp.tracking.uris import local_store_path


class ReadbackError(Exception):
    """What the store does not hold (the store, a run, a file): a refusal, exit status 2."""


def check_store(uri: str, *, explicit: bool) -> None:
    """Refuse a local store that does not exist (MLflow would create an empty one)."""
    db = local_store_path(uri)
    if db is not None and not db.exists():
        how = "" if explicit else " (the default store; set SLCA_EXP_ROOT or pass --tracking-uri)"
        raise ReadbackError(f"no MLflow store at {db}{how}")


def get_run(client: Any, run_id: str) -> Any | None:  # noqa: ANN401 - an mlflow Run
    """The run ``run_id`` of the client's store, or ``None`` when it has none of that id."""
    try:
        return client.get_run(run_id)
    except Exception:  # not a run id of this store
        return None


def looks_like_run_id(text: str) -> bool:
    """Whether ``text`` is written like an MLflow run id (32 lower-case hex digits)."""
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


def find_run(client: Any, target: str) -> Any:  # noqa: ANN401 - an mlflow Run
    """The run whose id is ``target``, else the only run named ``target`` in the store.

    Raises:
        ReadbackError: no such run, or several runs have that name (their ids, experiments and
            start times are listed).

    """
    if looks_like_run_id(target):
        run = get_run(client, target)
        if run is not None:
            return run
    experiments = {e.experiment_id: e.name for e in client.search_experiments()}
    ids = list(experiments)
    named = _named(client, ids, target) if ids else []
    if len(named) == 1:
        return named[0]
    where = shown_uri(client.tracking_uri)
    if named:
        listed = "\n".join(f"  {describe_run(run, experiments)}" for run in named)
        raise ReadbackError(
            f"the run name {target!r} matches {len(named)} runs in {where}:\n{listed}\n"
            "pass one of these run ids instead of the name"
        )
    latest = (
        client.search_runs(ids, max_results=5, order_by=["attributes.start_time DESC"])
        if ids
        else []
    )
    hint = "".join(f"\n  {describe_run(run, experiments)}" for run in latest)
    raise ReadbackError(
        f"no run with the id or name {target!r} in {where}; pass a run id or a run name "
        "(pass --tracking-uri if the run is in another store)."
        + (f" The latest runs:{hint}" if hint else " The store has no runs.")
    )


def _named(client: Any, experiment_ids: list[str], name: str) -> list[Any]:
    """The runs called ``name``, oldest first.

    MLflow's filter strings have no escape for a quote inside a value: a name is quoted with
    the quote it does not contain; a name with both kinds is matched here, over every run.
    """
    quote = "'" if "'" not in name else '"'
    if quote in name:
        return [r for r in search_all(client, experiment_ids) if r.info.run_name == name]
    return search_all(client, experiment_ids, f"attributes.run_name = {quote}{name}{quote}")


def describe_run(run: Any, experiments: dict[str, str]) -> str:  # noqa: ANN401 - an mlflow Run
    """``<id>  <name>  experiment <name>, started <time>`` for a list of runs."""
    experiment = experiments.get(run.info.experiment_id, run.info.experiment_id)
    started = (
        datetime.fromtimestamp(run.info.start_time / 1000).strftime("%Y-%m-%d %H:%M:%S")
        if run.info.start_time
        else "?"
    )
    name = run.info.run_name or "-"
    return f"{run.info.run_id}  {name}  experiment {experiment}, started {started}"


def logged_steps(client: Any, run_id: str, split: str) -> list[int]:
    """The steps whose records (``rollouts/<split>/step_<N>.jsonl``) the run logged, in order."""
    suffix = f".{RECORDS}"
    files = client.list_artifacts(run_id, folder(split))
    return sorted(
        step
        for f in files
        if not f.is_dir and f.path.endswith(suffix) and (step := step_of(f.path)) is not None
    )


def download_records(uri: str, run_id: str, split: str, step: int) -> list[RolloutRecord]:
    """The records of one logged step, read from a temporary copy of its ``.jsonl``.

    Raises:
        ReadbackError: the file is not a list of rollout records.

    """
    import mlflow

    path = artifact_path(split, step, RECORDS)
    with tempfile.TemporaryDirectory(prefix="slca-rollouts-") as tmp, no_progress_bar():
        local = mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path=path, dst_path=tmp, tracking_uri=uri
        )
        try:
            return list(read_records(Path(local)))
        except ValueError as err:
            raise ReadbackError(
                f"artifact {path} of run {run_id} is not a list of rollout records ({err}); "
                "was it written by another version of slca-exp?"
            ) from err
