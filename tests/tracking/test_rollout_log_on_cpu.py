"""A logged step's rollouts in a real MLflow store: traces linked to the run, a table, a view."""

import json
import math
import random
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from slca_exp.rollouts.files import artifact_path, read_records
from slca_exp.tracking import rollout_traces
from slca_exp.tracking.rollout_log import RolloutLog, table_columns
from slca_exp.tracking.rollout_traces import (
    FEEDBACK,
    JUDGE_FAILED,
    ROOT_NUMBERS,
    TAGS,
    TraceSources,
)
from tests.rollouts.checks import traces_of
from tests.rollouts.samples import step_records

SOURCES = TraceSources("replay", "hierr/strict", "rubric@rubric-v2", "slca_grpo")


def run_config(tmp_path):
    """A validated default config logging under ``tmp_path/out``, and its recipe."""
    from slca_exp.preflight.compose import compose_run
    from slca_exp.preflight.validate import validate
    from slca_exp.recipe import build_recipe

    config = validate(compose_run([f"tracking.root={tmp_path / 'out'}", "data.rows=16"]))
    return config, build_recipe(config)


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    run = client.create_run(experiment)
    yield client, uri, run.info.run_id, experiment
    mlflow.set_tracking_uri(None)


def test_each_record_is_a_trace_of_the_run_with_its_numbers_and_tags(store, tmp_path):
    client, uri, run_id, experiment = store
    records = step_records(step=10) + step_records(step=10, split="val")
    log = RolloutLog(uri, run_id, experiment, sources=SOURCES)
    log.log(records[:4], 10, "train")
    log.log(records[4:], 10, "val")
    log.flush()
    traces = traces_of(client, run_id)
    assert len(traces) == len(records)
    by_key = {(t.info.tags["slca.split"], t.info.tags["slca.group"], t.info.tags["slca.sample"]): t
              for t in traces}  # fmt: skip
    for record in records:
        trace = by_key[(record.split, record.group, str(record.sample))]
        assert {tag: trace.info.tags[tag] for tag in TAGS} == rollout_traces.trace_tags(record)
        root, turn, tool, summary = trace.data.spans
        assert [s.span_type for s in trace.data.spans] == [
            "AGENT",
            "CHAT_MODEL",
            "TOOL",
            "CHAT_MODEL",
        ]
        assert root.inputs == {"prompt": record.prompt, "tools": record.tools}
        assert root.outputs == {"summary": record.summary_text}
        # every number of the record, exactly, and nothing for what is unknown
        want = rollout_traces.root_attributes(record)
        assert {k: root.attributes[k] for k in want} == want
        assert set(ROOT_NUMBERS) - set(root.attributes) == {
            name for name in ROOT_NUMBERS if name not in want
        }
        if record.split == "val":
            assert "slca.adv.tool" not in root.attributes  # no update, no advantage
        else:
            assert root.attributes["slca.adv.tool"] == record.tool_adv
            assert root.attributes["slca.adv.summary"] == record.summary_adv
        if record.rewards.rating is None:  # the judge failed: no rating, its reason instead
            assert "slca.reward.rating" not in root.attributes
            assert root.attributes["slca.judge.reason"] == record.rewards.judge_reason
        assert (
            turn.attributes["slca.segment"] == "tool"
            and summary.attributes["slca.segment"] == "summary"
        )
        assert tool.inputs == {"name": "get_weather", "arguments": {"city": "Paris"}}
        assert tool.outputs == {
            "content": record.calls[0].answer.content,
            "simulator": "replay",
            "status": "ok",
            "cached": False,
        }
        # the rewards, the rating and the advantages as feedback, each from its source
        got = {a.name: a for a in trace.info.assessments}
        want = {f.name: f for f in rollout_traces.feedback(record, SOURCES)}
        assert set(got) == set(want) <= set(FEEDBACK)
        for name, a in got.items():
            assert (a.value, a.rationale, a.source.source_type, a.source.source_id) == (
                want[name].value,
                want[name].rationale,
                want[name].source.source_type,
                want[name].source.source_id,
            )
        assert got["reward_tool"].value == record.rewards.tool
        assert got["reward_tool"].source.source_id == "hierr/strict"
        assert got["judge_status"].value == record.rewards.judge_status
        if record.rewards.rating is None:  # a failed judgment: a failure, not a score
            assert got["judge_rating"].value is None
            assert got["judge_rating"].error.error_code == JUDGE_FAILED
            assert got["judge_rating"].error.error_message == record.rewards.judge_reason
        else:
            assert got["judge_rating"].value == record.rewards.rating
            assert got["judge_rating"].source.source_type == "LLM_JUDGE"
            assert got["judge_rating"].source.source_id == "rubric@rubric-v2"
        if record.split == "val":
            assert "advantage_tool" not in got
        else:
            assert got["advantage_summary"].value == record.summary_adv
            assert got["advantage_summary"].source.source_id == "slca_grpo"
    # the Traces tab's filters: by step, split, group, rank; and by feedback
    mlflow.set_tracking_uri(uri)
    failed = mlflow.search_traces(
        run_id=run_id,
        locations=[experiment],
        filter_string="feedback.judge_status = 'failed'",
        return_type="list",
    )
    assert len(failed) == sum(r.rewards.judge_status == "failed" for r in records) > 0
    high = mlflow.search_traces(
        run_id=run_id,
        locations=[experiment],
        filter_string="feedback.reward_tool > 0.5",
        return_type="list",
    )
    assert len(high) == sum(r.rewards.tool > 0.5 for r in records) > 0
    found = mlflow.search_traces(
        run_id=run_id,
        locations=[experiment],
        filter_string="tags.`slca.split` = 'train' AND tags.`slca.rank` = 'worst'",
        return_type="list",
    )
    assert sorted(t.info.tags["slca.group"] for t in found) == ["train-3", "train-9"]


def test_the_table_the_records_and_the_credit_view_are_the_runs_artifacts(store, tmp_path):
    client, uri, run_id, experiment = store
    records = step_records(step=10)
    RolloutLog(uri, run_id, experiment, sources=SOURCES).log(records, 10, "train")
    table_file = artifact_path("train", 10, "json")
    table = json.loads(
        Path(client.download_artifacts(run_id, table_file, str(tmp_path))).read_text()
    )
    columns = table_columns(records)
    assert table["columns"] == list(columns)
    advantages = [row[table["columns"].index("tool_advantage")] for row in table["data"]]
    assert advantages == [r.tool_adv for r in records]
    totals = [row[table["columns"].index("total")] for row in table["data"]]
    assert totals[:3] == [r.rewards.total for r in records[:3]] and totals[3] is None  # NaN
    logged = json.loads(client.get_run(run_id).data.tags["mlflow.loggedArtifacts"])
    assert {"path": table_file, "type": "table"} in logged  # MLflow's UI shows it as a table
    RolloutLog(uri, run_id, experiment, sources=SOURCES).log(step_records(step=20), 20, "train")
    logged = json.loads(client.get_run(run_id).data.tags["mlflow.loggedArtifacts"])
    assert [e["path"] for e in logged] == [table_file, artifact_path("train", 20, "json")]
    loaded = client.load_table(experiment, table_file, [run_id])  # MLflow reads it as its own
    assert list(loaded.columns) == list(columns)
    assert loaded["tool_advantage"].tolist() == [r.tool_adv for r in records]
    jsonl = client.download_artifacts(run_id, artifact_path("train", 10, "jsonl"), str(tmp_path))
    assert [r.to_dict() for r in read_records(Path(jsonl))] == [r.to_dict() for r in records]
    page = client.download_artifacts(run_id, artifact_path("train", 10, "html"), str(tmp_path))
    assert 'id="legend"' in Path(page).read_text()


def test_a_store_that_refuses_is_reported_once_and_nothing_raises(store, capsys, monkeypatch):
    client, uri, run_id, experiment = store
    # what the MLflow tracker sets for a run (tracking.http_retries / http_timeout_s)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    log = RolloutLog("http://127.0.0.1:9", run_id, experiment, sources=SOURCES)
    for step in (1, 10, 20):
        log.log(step_records(step=step), step, "train")
    log.flush()  # traces are sent in the background: their failures come in here
    err = capsys.readouterr().err
    for kind in ("traces", "table", "records"):
        assert err.count(f"slca-exp: rollout {kind} not logged to MLflow run {run_id}") == 1, err
    assert "training goes on, metrics are unaffected" in err


def test_a_failing_trace_leaves_the_metrics_and_the_run_finished(tmp_path, monkeypatch, capsys):
    """Through the MLflow tracker as a run uses it: a trace that cannot be written loses nothing."""
    from slca_exp.tracking.base import MultiTracker
    from slca_exp.tracking.mlflow import MlflowTracker
    from slca_exp.tracking.redact import Redactor

    def broken(*args, **kwargs):
        raise RuntimeError("trace store is full")

    monkeypatch.setattr(rollout_traces, "write_trace", broken)
    config, recipe = run_config(tmp_path)
    tracker = MultiTracker([MlflowTracker(config.tracking, "r", Redactor())], plots=False)
    tracker.start(recipe, {"a": 1})
    for step in (1, 2, 3):
        tracker.log_rollouts(step_records(step=step), step, "train")
        tracker.log_metrics({"reward/tool/mean": step / 10}, step)
    tracker.finish("FINISHED")
    backend = tracker.trackers[0]
    run = backend.client.get_run(backend.run_id)
    assert run.info.status == "FINISHED"
    history = backend.client.get_metric_history(backend.run_id, "reward/tool/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    err = capsys.readouterr().err
    assert err.count("rollout traces not logged") == 1 and "trace store is full" in err
    # the rest of each step is there all the same
    names = {a.path for a in backend.client.list_artifacts(backend.run_id, "rollouts/train")}
    assert {artifact_path("train", s, "jsonl") for s in (1, 2, 3)} <= names


def test_secrets_are_redacted_from_every_trace_and_file(tmp_path):
    from slca_exp.tracking.base import MultiTracker
    from slca_exp.tracking.mlflow import MlflowTracker
    from slca_exp.tracking.redact import Redactor
    from tests.planted import leaks, mlflow_texts

    secret = "sk-planted-rollout-secret-0042"
    records = step_records(step=1)
    records[0].prompt[0]["content"] += f" key={secret}"
    records[0].calls[0].answer.content = secret
    config, recipe = run_config(tmp_path)
    tracker = MultiTracker([MlflowTracker(config.tracking, "r", Redactor([secret]))], plots=False)
    tracker.start(recipe, {})
    tracker.log_rollouts(records, 1, "train")
    tracker.finish("FINISHED")
    backend = tracker.trackers[0]
    texts = mlflow_texts(backend.client, backend.run_id, tmp_path / "artifacts")
    assert any("<redacted>" in t for t in texts)
    assert leaks(secret, [tmp_path], texts) == []
    assert not math.isnan(records[0].rewards.total)


def test_runs_seeded_alike_keep_every_trace_and_their_own_random_stream(store):
    """Trace ids must not follow the run's seed: runs of one seed would overwrite each other."""
    client, uri, run_id, experiment = store
    other = client.create_run(experiment).info.run_id
    records = step_records(step=1)
    random.seed(0)
    expected = random.random()
    for run in (run_id, other):
        random.seed(0)  # as an engine seeds every run of seed 0
        log = RolloutLog(uri, run, experiment, sources=SOURCES)
        log.log(records, 1, "train")
        assert random.random() == expected  # the run's stream is as if nothing was logged
    log.flush()
    assert len(traces_of(client, run_id)) == len(traces_of(client, other)) == len(records)
