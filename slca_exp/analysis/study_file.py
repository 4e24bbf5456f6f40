"""A study file: what ``slca-exp compare`` reads of a sweep, in one small file.

    slca-exp compare SWEEP --save-study study.json.gz     # write it
    slca-exp compare study.json.gz [--report ...]         # compare it, no MLflow store needed

An MLflow store of a study is large (its traces, checkpoints and every step's rollouts); the
study file keeps only what ``compare`` reads, so a result page can be regenerated from a file
committed beside it:

- the sweep's parent run and every compared run: name, status, start and end time, params, tags;
- the full history (step, timestamp, value) of the compared metrics, of the per-step
  diagnostics and of the curves the plots draw (other metrics are left out);
- each run's ``recipe.json`` (the comparability guard reads it);
- each run's final validation rollouts, with their prompt's user turns and their rewards
  (``--variance`` and the report's moved prompts read these; responses and tokens are left out).

:func:`load_study` writes it into an MLflow store (``compare`` uses a temporary one), each run
tagged with the id it had (:data:`~slca_exp.core.tags.COPY_OF`), which compare shows in place of
the copy's id. Saving a loaded copy writes the same file again. :func:`restore_study`
(``slca-exp restore``) writes a sweep's file into a lasting store, where the sweep resumes.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from slca_exp.analysis.runs import shown_id
from slca_exp.core.tags import COPY_OF, PARENT_RUN, RUN_NAME

FORMAT = "slca-exp study file 1"
SUFFIX = ".json.gz"
_BATCH = 900  # under MLflow's log_batch limits (1000 metrics, 100 params and tags: chunked)
_TAG_BATCH = 90
_NOT_COPIED_TAGS = (PARENT_RUN, RUN_NAME, COPY_OF)


class StudyFileError(Exception):
    """A file that is not a study file, or a store that cannot take one."""


def save_study(
    observe: Any,  # noqa: ANN401 - an analysis.runs.Observations
    parent: Any | None,  # noqa: ANN401 - an mlflow Run
    runs: Sequence[Any],
    metrics: Sequence[str],
    path: Path,
) -> Path:
    """Write the study file of ``runs`` (and their sweep's ``parent``, if any) to ``path``.

    ``metrics`` are the names whose histories are kept (with the plots' curves and the per-step
    diagnostics); gzip's header carries no time and no name, so the same study writes the same
    bytes.
    """
    from slca_exp.analysis.estimates import MEAN_OVER_STEPS
    from slca_exp.analysis.plots import curve_metrics
    from slca_exp.core.tags import SWEEP
    from slca_exp.tracking.mlflow import mlflow_key

    client = observe.client
    kept = sorted({mlflow_key(m) for m in (*metrics, *MEAN_OVER_STEPS, *curve_metrics())})
    parent_id = shown_id(parent) if parent is not None else None
    entries = [] if parent is None else [_run_entry(observe, parent, kept, None, parent=True)]
    entries += [_run_entry(observe, run, kept, parent_id, parent=False) for run in runs]
    first = parent if parent is not None else runs[0]
    study = {
        "format": FORMAT,
        "sweep": first.data.tags.get(SWEEP, ""),
        "experiment": client.get_experiment(first.info.experiment_id).name,
        "metrics": kept,
        "runs": entries,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(study, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    with path.open("wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as out:
        out.write(text.encode("utf-8"))
    return path


def read_study(path: Path) -> dict[str, Any]:
    """The study file's content.

    Raises:
        StudyFileError: not a gzipped study file of this format.

    """
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            study = json.load(handle)
    except (OSError, ValueError) as err:
        raise StudyFileError(f"{path} is not a study file ({err})") from err
    if not isinstance(study, dict) or study.get("format") != FORMAT:
        found = study.get("format") if isinstance(study, dict) else type(study).__name__
        raise StudyFileError(
            f"{path} is not a study file of this slca-exp (format {found!r}, expected "
            f"{FORMAT!r}); write it again with `slca-exp compare SWEEP --save-study FILE`"
        )
    return study


def load_study(
    study: dict[str, Any],
    client: Any,  # noqa: ANN401
    artifact_root: Path | None,
    *,
    existing: bool = False,
) -> str:
    """Write ``study`` (:func:`read_study`) into the store of ``client``; returns its target.

    The target is the sweep id when the study has a parent run, else the experiment's name.
    A new experiment keeps its artifacts under ``artifact_root`` (``None``: the store's
    default); with ``existing``, a sweep's runs join its experiment if the store has it.
    """
    return _load(study, client, artifact_root, existing=existing)[0]


def _load(
    study: dict[str, Any],
    client: Any,  # noqa: ANN401
    artifact_root: Path | None,
    *,
    existing: bool,
) -> tuple[str, str | None]:
    """:func:`load_study`, and the new id of the sweep's parent run (``None``: no sweep)."""
    from mlflow.entities import Metric, Param, RunTag

    name = study["experiment"]
    found = client.get_experiment_by_name(name)
    if found is not None and not (existing and has_sweep(study)):
        raise StudyFileError(
            f"the store already has an experiment {name!r}; load the study into an empty store"
        )
    location = artifact_root.as_uri() if artifact_root is not None else None
    experiment = (
        found.experiment_id
        if found is not None
        else client.create_experiment(name, artifact_location=location)
    )
    new_parent = None
    for entry in study["runs"]:
        tags = {k: v for k, v in entry["tags"].items() if k not in _NOT_COPIED_TAGS}
        tags[COPY_OF] = entry["id"]
        if entry["parent_run"] is not None:
            if new_parent is None:
                raise StudyFileError("a child run comes before its sweep's parent run")
            tags[PARENT_RUN] = new_parent
        run = client.create_run(experiment, start_time=entry["start_time"], run_name=entry["name"])
        run_id = run.info.run_id
        metrics = [
            Metric(key, value, timestamp, step)
            for key, points in entry["metrics"].items()
            for step, timestamp, value in points
        ]
        params = [Param(k, v) for k, v in entry["params"].items()]
        tag_list = [RunTag(k, v) for k, v in tags.items()]
        for i in range(0, len(metrics), _BATCH):
            client.log_batch(run_id, metrics=metrics[i : i + _BATCH])
        for i in range(0, max(len(params), len(tag_list)), _TAG_BATCH):
            client.log_batch(
                run_id, params=params[i : i + _TAG_BATCH], tags=tag_list[i : i + _TAG_BATCH]
            )
        if entry["recipe"] is not None:
            client.log_dict(run_id, entry["recipe"], "recipe.json")
        if entry["val_records"] is not None:
            _log_records(client, run_id, entry["val_records"])
        client.set_terminated(run_id, status=entry["status"], end_time=entry["end_time"])
        if entry["is_parent"]:
            new_parent = run_id
    return (study["sweep"] if new_parent is not None else name), new_parent


def has_sweep(study: dict[str, Any]) -> bool:
    """Whether ``study`` holds a sweep (its parent run), rather than an experiment's runs."""
    return any(entry["is_parent"] for entry in study["runs"])


@contextmanager
def opened_study(path: Path) -> Iterator[tuple[str, str]]:
    """A temporary MLflow store holding the study file at ``path``: ``(tracking URI, target)``."""
    study = read_study(path)
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory(prefix="slca-study-") as tmp:
        uri = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        target = load_study(study, MlflowClient(tracking_uri=uri), Path(tmp) / "artifacts")
        yield uri, target


@dataclasses.dataclass(frozen=True)
class Restored:
    """A study file's sweep as :func:`restore_study` wrote it into a store."""

    sweep: str
    parent_run_id: str
    """The restored parent run (a copy: its ``slca.copy_of`` names the original)."""
    statuses: dict[str, int]
    """Run status -> how many of the sweep's runs (the parent left out) have it."""
    command: list[str]
    """The ``slca-exp train`` arguments the sweep recorded (empty if it recorded none)."""


def restore_study(path: Path, uri: str) -> Restored:
    """Write the sweep of the study file at ``path`` into the store at ``uri``, to resume there.

    Its runs join the experiment they were in (created where missing, artifacts where
    ``slca-exp train`` would put them); the sweep's own command line, run again on that store,
    then keeps every FINISHED job whose recipe fingerprint still matches.

    Raises:
        StudyFileError: not a study file, a study without a sweep, or a store that already
            holds this sweep.

    """
    from slca_exp.core.tags import SWEEP_COMMAND
    from slca_exp.launch.resume import sweep_parent
    from slca_exp.tracking.store import open_client
    from slca_exp.tracking.uris import artifact_root

    study = read_study(path)
    if not has_sweep(study):
        raise StudyFileError(
            f"{path} holds the runs of experiment {study['experiment']!r}, not a sweep: there is "
            "nothing to resume (compare it with slca-exp compare FILE.json.gz)"
        )
    client = open_client(uri)
    sweep = study["sweep"]
    held = sweep_parent(client, sweep)
    if held is not None:
        raise StudyFileError(
            f"{uri} already holds sweep {sweep} (parent run {held.info.run_id}); resume it "
            f"there (slca-exp train --resume {sweep} --tracking-uri {uri}) or restore into "
            "another store"
        )
    root = artifact_root(None, uri)
    _, new_parent = _load(study, client, root / "mlartifacts" if root else None, existing=True)
    assert new_parent is not None  # has_sweep
    parent = next(e for e in study["runs"] if e["is_parent"])
    statuses: dict[str, int] = {}
    for entry in study["runs"]:
        if not entry["is_parent"]:
            statuses[entry["status"]] = statuses.get(entry["status"], 0) + 1
    recorded = parent["tags"].get(SWEEP_COMMAND)
    return Restored(sweep, new_parent, statuses, json.loads(recorded) if recorded else [])


def _run_entry(
    observe: Any,  # noqa: ANN401
    run: Any,  # noqa: ANN401
    kept: Sequence[str],
    parent_id: str | None,
    *,
    parent: bool,
) -> dict[str, Any]:
    histories = {
        key: [
            [m.step, m.timestamp, m.value]
            for m in sorted(
                observe.client.get_metric_history(run.info.run_id, key),
                key=lambda m: (m.step, m.timestamp),
            )
        ]
        for key in kept
        if key in run.data.metrics
    }
    return {
        "id": shown_id(run),
        "is_parent": parent,
        "parent_run": parent_id,
        "name": run.info.run_name or "",
        "status": run.info.status,
        "start_time": run.info.start_time,
        "end_time": run.info.end_time,
        "params": dict(run.data.params),
        "tags": {k: v for k, v in run.data.tags.items() if k not in _NOT_COPIED_TAGS},
        "metrics": histories,
        "recipe": None if parent else _recipe(run),
        "val_records": None if parent else _final_val_records(observe, run),
    }


def _recipe(run: Any) -> dict[str, Any] | None:  # noqa: ANN401
    import mlflow

    from slca_exp.tracking.sweep_runs import no_progress_bar

    try:
        with no_progress_bar():
            return mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/recipe.json")
    except Exception:  # an older run without recipe.json: compare reads its tags then
        return None


def _final_val_records(observe: Any, run: Any) -> dict[str, Any] | None:  # noqa: ANN401
    found = observe.final_val(run)
    if found is None:
        return None
    step, records = found
    return {"step": step, "records": [_trimmed(r).to_dict() for r in records]}


def _trimmed(record: Any) -> Any:  # noqa: ANN401 - a RolloutRecord
    """The record with its prompt's user turns and its rewards; no response, tokens or calls."""
    return dataclasses.replace(
        record,
        prompt=[m for m in record.prompt if m.get("role") == "user"],
        tools=[],
        gold=[],
        response="",
        token_ids=[],
        token_text=[],
        segments="",
        advantages=[],
        logprobs=[],
        turns=[],
        calls=[],
        tool_adv=None,
        summary_adv=None,
        drift=None,
    )


def _log_records(client: Any, run_id: str, logged: dict[str, Any]) -> None:  # noqa: ANN401
    from slca_exp.rollouts.files import RECORDS, artifact_path, folder
    from slca_exp.rollouts.record import RolloutRecord

    path = artifact_path("val", logged["step"], RECORDS)
    with tempfile.TemporaryDirectory(prefix="slca-study-") as tmp:
        local = Path(tmp) / Path(path).name
        local.write_text(
            "".join(RolloutRecord.from_dict(r).to_json() + "\n" for r in logged["records"]),
            encoding="utf-8",
        )
        client.log_artifact(run_id, str(local), folder("val"))
