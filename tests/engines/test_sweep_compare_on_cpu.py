"""A ready study run for real on the local engine under one parent, then compare.

``sweep=exec_control experiment=smoke``: {grpo, slca_grpo} x {hierr_paper, exec_outcome}, at a
reduced size (one seed, tiny model, two RL steps): the outcome reward's facts rule decides R_tool.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from slca_exp.tracking import readback
from tests.engines.test_engine_runs_on_cpu import TINY

EXE = str(Path(sys.executable).parent / "slca-exp")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The study's store: (folder, environment, root, its runs)."""
    tmp_path = tmp_path_factory.mktemp("exec-control")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    root = tmp_path / "out"
    res = subprocess.run(
        [
            EXE,
            "train",
            "-m",
            "sweep=exec_control",
            "experiment=smoke",
            "seed=0",
            *TINY,
            "engine.rl.steps=2",
            f"tracking.root={root}",
            f"hydra.sweep.dir={tmp_path / 'multirun'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    return tmp_path, env, root, runs


@pytest.mark.slow
def test_the_exec_control_study_gives_four_children_and_compare_shows_them(study):
    tmp_path, env, root, runs = study
    (parent,) = [r for r in runs if r.data.tags.get("slca.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 4 and parent.info.status == "FINISHED"
    assert all(r.info.status == "FINISHED" for r in children)
    assert parent.data.tags["slca.study"] == "exec_control"
    cells = {(r.data.params["algorithm.name"], r.data.params["reward.name"]) for r in children}
    assert cells == {(a, w) for a in ("grpo", "slca_grpo") for w in ("hierr_paper", "exec_outcome")}
    for child in children:
        metrics = child.data.metrics
        assert "val/tool_success_at_0.9" in metrics and "val/reward/tool/hierr/mean" in metrics
        outcome = child.data.params["reward.name"] == "exec_outcome"
        # a tiny policy may make no call at all: then no verdict, yet the judge's counts
        assert ("val/outcome/requests" in metrics) == outcome
        assert ("outcome/requests" in metrics) == outcome

    out = subprocess.run(
        [
            EXE,
            "compare",
            parent.data.tags["slca.sweep"],
            "--tracking-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--out",
            str(tmp_path / "cmp"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "compare-runs?runs=" in out.stdout
    assert "slca_grpo - grpo" in out.stdout  # the paired difference per reward
    for child in children:
        assert child.info.run_id in out.stdout
    assert list((tmp_path / "cmp").glob("*.png"))


@pytest.mark.slow
def test_rollouts_against_pairs_every_validation_prompt_of_two_runs_of_a_seed(study):
    tmp_path, env, root, runs = study
    uri = f"sqlite:///{root / 'mlflow.db'}"
    cell = {
        (r.data.params["algorithm.name"], r.data.params["reward.name"]): r.info.run_id
        for r in runs
        if r.data.tags.get("slca.role") == "child"
    }
    a, b = cell["grpo", "hierr_paper"], cell["slca_grpo", "hierr_paper"]
    res = subprocess.run(
        [EXE, "rollouts", a, "--against", b, "--val", "--tracking-uri", uri],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    records = {}
    for side, run_id in (("A", a), ("B", b)):
        steps = readback.logged_steps(MlflowClient(uri), run_id, "val")
        records[side] = readback.download_records(uri, run_id, "val", steps[-1])
        assert f"{side}: run " in out and f"({run_id}), val step {steps[-1]}" in out
    prompts = {r.group for r in records["A"]}
    assert prompts == {r.group for r in records["B"]} and len(prompts) == 2  # engine.val_rows=2
    assert f"{len(prompts)} val prompts paired." in out
    blocks = out.split("━━ ")[1:]
    assert sorted(b.split(" · ")[0] for b in blocks) == sorted(prompts)
    for block in blocks:  # both rewards, as the runs logged them, and B - A
        group = block.split(" · ")[0]
        for side in ("A", "B"):
            (record,) = [r for r in records[side] if r.group == group]
            assert f"{side}  tool {record.rewards.tool:.3f}  summary " in block, block
        (line,) = [x for x in block.splitlines() if x.startswith("B - A  tool ")]
        tool_a, tool_b = (
            next(r.rewards.tool for r in records[s] if r.group == group) for s in "AB"
        )
        assert line.startswith(f"B - A  tool {tool_b - tool_a:+.3f}"), line


@pytest.mark.slow
def test_the_report_lists_the_prompts_that_moved_most_between_the_algorithms(study):
    tmp_path, env, root, runs = study
    uri = f"sqlite:///{root / 'mlflow.db'}"
    (parent,) = [r for r in runs if r.data.tags.get("slca.role") == "parent"]
    report = tmp_path / "report.md"
    res = subprocess.run(
        [EXE, "compare", parent.data.tags["slca.sweep"], "--tracking-uri", uri]
        + ["--out", str(tmp_path / "cmp-report"), "--report", str(report)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    section = report.read_text().split("## The prompts that moved most", 1)[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| val-")]
    # Both cells of the reward pair their grpo and slca_grpo runs: each prompt over 2 pairs.
    deltas = {}
    for reward in ("hierr_paper", "exec_outcome"):
        cell = {
            r.data.params["algorithm.name"]: r.info.run_id
            for r in runs
            if r.data.tags.get("slca.role") == "child" and r.data.params["reward.name"] == reward
        }
        by_algorithm = {}
        for algorithm, run_id in cell.items():
            steps = readback.logged_steps(MlflowClient(uri), run_id, "val")
            by_algorithm[algorithm] = readback.download_records(uri, run_id, "val", steps[-1])
        for a in by_algorithm["grpo"]:
            (b,) = [r for r in by_algorithm["slca_grpo"] if r.group == a.group]
            deltas.setdefault(a.group, []).append(b.rewards.total - a.rewards.total)
    assert len(rows) == len(deltas) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        group, pairs, delta = cells[0], cells[2], cells[-1]
        assert pairs == "2" and delta == f"{sum(deltas[group]) / 2:+.3f}", row
    shown = [abs(float(row.strip("|").split(" | ")[-1])) for row in rows]
    assert shown == sorted(shown, reverse=True)  # the most changed first
