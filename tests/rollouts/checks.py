"""What every run's logged rollouts must hold in MLflow, checked the same way for both engines."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
from mlflow import MlflowClient

from slca_exp.core.names import ROLLOUT_TOKEN_MISMATCH_FRAC, val
from slca_exp.rollouts.files import ARTIFACT_DIR
from slca_exp.tracking.rollout_traces import TAGS

SEGMENT_NUMBERS = (
    "slca.reward.tool",
    "slca.reward.routed_tool",
    "slca.tokens.tool",
    "slca.tokens.summary",
)
"""Numbers every train rollout's root span carries (the summary's need a judge that answered)."""


def traces_of(client: MlflowClient, run_id: str) -> list:
    """The run's traces, found the way a user finds them: ``search_traces(run_id=...)``."""
    experiment = client.get_run(run_id).info.experiment_id
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(client.tracking_uri)
    try:
        return mlflow.search_traces(run_id=run_id, locations=[experiment], return_type="list")
    finally:
        mlflow.set_tracking_uri(previous)


def signature(traces: list) -> dict[str, set[str]]:
    """Span type -> the ``slca.*`` attribute names its spans carry; plus the trace tag names and
    the feedback names with their source types."""
    out: dict[str, set[str]] = {"tags": set(), "feedback": set()}
    for trace in traces:
        out["tags"] |= {t for t in trace.info.tags if t.startswith("slca.")}
        out["feedback"] |= {f"{a.name}:{a.source.source_type}" for a in trace.info.assessments}
        for span in trace.data.spans:
            names = {a for a in span.attributes if a.startswith("slca.")}
            out.setdefault(span.span_type, set()).update(names)
    return out


def check_run_rollouts(client: MlflowClient, run_id: str, into: Path) -> dict[str, list]:
    """Traces with TOOL and chat spans, segment numbers, step tags; a table; a credit view.

    Returns the run's traces by split.
    """
    traces = traces_of(client, run_id)
    assert traces, f"run {run_id} has no traces"
    by_split: dict[str, list] = {}
    for trace in traces:
        assert set(TAGS) <= set(trace.info.tags), trace.info.tags
        assert trace.info.trace_metadata["mlflow.sourceRun"] == run_id
        by_split.setdefault(trace.info.tags["slca.split"], []).append(trace)
    train = by_split["train"]
    kinds = {span.span_type for trace in train for span in trace.data.spans}
    assert {"AGENT", "CHAT_MODEL", "TOOL"} <= kinds, kinds
    for trace in train:
        root = trace.data.spans[0]
        assert int(trace.info.tags["slca.step"]) >= 1
        for name in SEGMENT_NUMBERS:
            assert isinstance(root.attributes[name], (int, float)), (name, root.attributes)
        judged = root.attributes["slca.judge.status"] != "failed"
        # a penalised no-call's total is the penalty, whatever its judge did (its reply is judged
        # when it writes a <tool_response> block of its own, and that request can fail)
        penalised = bool(root.attributes["slca.should_no_call"])
        assert ("slca.reward.total" in root.attributes) == (judged or penalised), root.attributes
        assert ("slca.reward.rating" in root.attributes) == (
            root.attributes["slca.judge.status"] == "ok"
        ), root.attributes
        rated = "slca.reward.rating" in root.attributes  # judge.noise keeps the judge's own
        assert ("slca.reward.raw_rating" in root.attributes) == rated, root.attributes
        has_tool = root.attributes["slca.tokens.tool"] > 0
        assert ("slca.adv.tool" in root.attributes) == has_tool, root.attributes
        assert isinstance(root.attributes["slca.adv.summary"], float)
    files = [a.path for a in client.list_artifacts(run_id, f"{ARTIFACT_DIR}/train")]
    tables = [f for f in files if f.endswith(".json")]
    views = [f for f in files if f.endswith(".html")]
    assert tables and views, files
    table = json.loads(Path(client.download_artifacts(run_id, tables[0], str(into))).read_text())
    assert {"tool_advantage", "summary_advantage", "tool_reward", "summary_rating"} <= set(
        table["columns"]
    ), table["columns"]
    column = table["columns"].index("summary_advantage")
    assert any(isinstance(row[column], float) for row in table["data"]), table["data"]
    logged = json.loads(client.get_run(run_id).data.tags["mlflow.loggedArtifacts"])
    assert {"path": tables[0], "type": "table"} in logged
    page = Path(client.download_artifacts(run_id, views[0], str(into))).read_text()
    assert "<script" not in page and 'id="legend"' in page
    check_no_token_drift(client, run_id, traces)
    return by_split


def check_no_token_drift(client: MlflowClient, run_id: str, traces: list) -> None:
    """Every logged rollout's ids are its chat template's rendering: 0 tokens drift, each step."""
    for trace in traces:
        root = trace.data.spans[0].attributes
        drift = {k: v for k, v in root.items() if k.startswith("slca.drift.")}
        assert drift == {"slca.drift.tokens": 0}, drift
    for split in ("train", "val"):
        name = ROLLOUT_TOKEN_MISMATCH_FRAC if split == "train" else val(ROLLOUT_TOKEN_MISMATCH_FRAC)
        tags = [t.info.tags for t in traces]
        steps = {int(tag["slca.step"]) for tag in tags if tag["slca.split"] == split}
        history = client.get_metric_history(run_id, name)
        assert {m.step for m in history} >= steps and all(m.value == 0 for m in history), history
