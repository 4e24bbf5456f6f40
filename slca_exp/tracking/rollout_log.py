"""A logged step's rollouts into an MLflow run: traces, a table, a credit view, the records.

    records of one step (one split)
      -> one trace per record, linked to the run (``rollout_traces.py``)
      -> rollouts/<split>/step_<N>.json    a table (:func:`table_columns`), as ``mlflow.log_table``
                                           writes one
      -> rollouts/<split>/step_<N>.html    the credit view (``tracking.rollouts.html``)
      -> rollouts/<split>/step_<N>.jsonl   the records (what ``slca-exp rollouts`` reads)

The three files go up in one artifact upload, and the table is registered the way
``mlflow.log_table`` registers one (the run's ``mlflow.loggedArtifacts`` tag, which MLflow's UI
reads): ``log_table`` itself builds a DataFrame, lists the folder and reads the run back on every
call, which was most of a logged step's cost while the traces export in the background.

Logging rollouts is a view on the run, never a reason for it to fail: anything that cannot be
written is reported once (the first failure, with its error) and the run goes on; metrics are
logged elsewhere and never wait on it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slca_exp.rollouts import files
from slca_exp.rollouts.record import RolloutRecord, finite_or_none
from slca_exp.tracking.rollout_traces import TraceSources

COMPONENTS = ("format", "name", "key", "value", "parallel")


def table_columns(records: Sequence[RolloutRecord]) -> dict[str, list[Any]]:
    """One row per rollout: what the MLflow table and the W&B table hold (same columns)."""
    rows = [_row(r) for r in records]
    return {name: [row[name] for row in rows] for name in rows[0]} if rows else {}


def _row(r: RolloutRecord) -> dict[str, Any]:
    rewards = r.rewards
    row: dict[str, Any] = {
        "step": r.step,
        "split": r.split,
        "prompt_id": r.group,
        "sample": r.sample,
        "rank": r.rank,
        "response": r.response,
        "gold_calls": json.dumps(r.gold, ensure_ascii=False),
        "tool_reward": finite_or_none(rewards.tool),
    }
    for part in COMPONENTS:
        row[f"tool_{part}"] = finite_or_none(rewards.components.get(part))
    row.update(
        {
            "summary_rating": rewards.rating,
            "judge_raw_rating": rewards.raw_rating,
            "summary_reward": finite_or_none(rewards.summary),
            "judge_status": rewards.judge_status,
            "total": finite_or_none(rewards.total),
            "tool_hierr": finite_or_none(rewards.hierr),
            "outcome_verdict": rewards.outcome,
            "tool_advantage": finite_or_none(r.tool_adv),
            "summary_advantage": finite_or_none(r.summary_adv),
            "turns": sum(1 for t in r.turns if t.role == "assistant"),
            "tool_calls": len(r.calls),
            "length": len(r.token_ids),
            "tool_tokens": r.segment_tokens("tool"),
            "summary_tokens": r.segment_tokens("summary"),
            "ends_on_tool_call": r.ends_on_tool_call,
            "token_drift": None if r.drift is None else r.drift.mismatched,
        }
    )
    return row


class RolloutLog:
    """Writes logged steps into one MLflow run.

    Args:
        uri: the run's tracking URI.
        run_id: the run.
        experiment_id: its experiment (where its traces are kept).
        sources: the simulator (on every TOOL span) and the sources of the traces' feedback.
        html: write the credit view.

    """

    def __init__(
        self,
        uri: str,
        run_id: str,
        experiment_id: str,
        *,
        sources: TraceSources,
        html: bool = True,
    ) -> None:
        self.uri = uri
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.sources = sources
        self.html = html
        self.warned: set[str] = set()
        self._tables: list[dict[str, str]] | None = None  # the run's mlflow.loggedArtifacts

    def log(self, records: Sequence[RolloutRecord], step: int, split: str) -> None:
        """Log one step's records; never raises (a failure is reported once per kind)."""
        if not records:
            return
        _ExportFailures.watch(self)
        self._guard("traces", lambda: self._traces(records))
        with tempfile.TemporaryDirectory(prefix="slca-exp-rollouts-") as tmp:
            folder = Path(tmp)
            self._guard("records", lambda: self._files(records, step, split, folder))
            if (folder / files.file_name(step, files.TABLE)).is_file():
                self._guard("table", lambda: self._register_table(split, step))

    def flush(self) -> None:
        """Wait for traces still being exported (MLflow exports them in the background)."""
        self._guard("traces", _flush_traces)

    # --- parts -----------------------------------------------------------------------------

    def _traces(self, records: Sequence[RolloutRecord]) -> None:
        from slca_exp.tracking.rollout_traces import write_trace

        _use_store(self.uri)
        for record in records:
            write_trace(
                record,
                run_id=self.run_id,
                experiment_id=self.experiment_id,
                sources=self.sources,
            )

    def _files(self, records: Sequence[RolloutRecord], step: int, split: str, tmp: Path) -> None:
        """The step's table, records and credit view, in one upload."""
        from mlflow import MlflowClient

        files.write_records(records, tmp / files.file_name(step, files.RECORDS))
        table = table_columns(records)
        rows = [list(row) for row in zip(*table.values(), strict=True)]
        body = {"columns": list(table), "data": rows}
        text = json.dumps(body, ensure_ascii=False, allow_nan=False)
        (tmp / files.file_name(step, files.TABLE)).write_text(text, encoding="utf-8")
        if self.html:
            from slca_exp.tracking.credit_view import render_credit_view

            title = f"{split} step {step}: rollouts and their token advantages"
            page = tmp / files.file_name(step, files.VIEW)
            page.write_text(render_credit_view(records, title=title), encoding="utf-8")
        MlflowClient(self.uri).log_artifacts(self.run_id, str(tmp), files.folder(split))

    def _register_table(self, split: str, step: int) -> None:
        """Add the table to the run's ``mlflow.loggedArtifacts``, as ``mlflow.log_table`` does.

        The tag is read from the run once (a resumed run keeps the tables it listed); this
        instance is the run's only writer of it after that.
        """
        from mlflow import MlflowClient
        from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

        client = MlflowClient(self.uri)
        if self._tables is None:
            tag = client.get_run(self.run_id).data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]")
            self._tables = json.loads(tag)
        entry = {"path": files.artifact_path(split, step, files.TABLE), "type": "table"}
        if entry not in self._tables:
            self._tables.append(entry)
            client.set_tag(self.run_id, MLFLOW_LOGGED_ARTIFACTS, json.dumps(self._tables))

    def _guard(self, kind: str, action: Any) -> None:  # noqa: ANN401
        try:
            action()
        except Exception as err:  # noqa: BLE001 - a view on the run must not fail it
            self.report(kind, f"{type(err).__name__}: {str(err)[:300]}")

    def report(self, kind: str, what: str) -> None:
        """Say once per kind (``traces``, ``table``, ``records``) that it could not be logged."""
        if kind in self.warned:
            return
        self.warned.add(kind)
        print(
            f"slca-exp: rollout {kind} not logged to MLflow run {self.run_id} ({what}); "
            "training goes on, metrics are unaffected, and this is reported once",
            file=sys.stderr,
        )


class _ExportFailures(logging.Filter):
    """MLflow's warnings about traces it could not send, as the rollout log's one report.

    MLflow exports traces in the background and logs a warning for each failure; the first
    becomes the log's report, the repeats are dropped.
    """

    LOGGER = "mlflow.tracing.export.mlflow_v3"
    installed: _ExportFailures | None = None

    def __init__(self) -> None:
        super().__init__()
        self.log: RolloutLog | None = None

    QUEUE = "mlflow.tracing.export.async_export_queue"
    """Its INFO line at exit ("Flushing the async trace logging queue") would end every run's
    output; the run's own closing lines come last instead (warnings still show)."""

    @classmethod
    def watch(cls, log: RolloutLog) -> None:
        if cls.installed is None:
            cls.installed = cls()
            logging.getLogger(cls.LOGGER).addFilter(cls.installed)
            queue = logging.getLogger(cls.QUEUE)
            queue.setLevel(max(queue.getEffectiveLevel(), logging.WARNING))
        cls.installed.log = log

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.log is None or not message.startswith("Failed to send trace"):
            return True
        self.log.report("traces", message[:300])
        return False


def _use_store(uri: str) -> None:
    """Point MLflow's fluent API (traces) of this process at ``uri``.

    MLflow also exports the URI as ``MLFLOW_TRACKING_URI``; that is put back as it was, so the
    run's child processes and slca-exp's default store (``tracking/uris.py``) are unchanged.
    """
    import mlflow

    if mlflow.get_tracking_uri() == uri:
        return
    exported = os.environ.get(_URI_ENV)
    mlflow.set_tracking_uri(uri)
    if exported is None:
        os.environ.pop(_URI_ENV, None)
    else:
        os.environ[_URI_ENV] = exported


_URI_ENV = "MLFLOW_TRACKING_URI"


def _flush_traces() -> None:
    import mlflow

    flush = getattr(mlflow, "flush_trace_async_logging", None)
    if callable(flush):
        flush()
