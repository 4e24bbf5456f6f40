"""Runs of one seed pair up: a real sweep of the local engine, read back by ``compare --report``.

Seeds 0 and 1 x ``tracking.rollouts.every=0,1`` (a factor that must not change what a run
learns), one algorithm, a noisy judge (``judge.noise=flip``, p=0.5) and ``engine.rl.grad_cos``:
four real runs from the tiny tool-calling checkpoint. Within a seed the two runs are the same
run (the first trains the seed's SFT, the second loads it from the cache), so every pair's
difference is exactly 0; the noise is logged beside the judge's ratings.
"""

import json
import math
import subprocess
from pathlib import Path

import pytest

from tests.engines.tool_caller import quick_sweep
from tests.tracking.sweeps import SLCA_EXE

METRICS = ("val/reward/tool/mean", "reward/total/mean", "train/grad_cos")


@pytest.fixture(scope="module")
def sweep(tool_caller, tmp_path_factory):
    done = quick_sweep(
        tmp_path_factory.mktemp("paired"),
        tool_caller.folder,
        "algorithm=slca_grpo",
        "engine.rollout.temperature=1.0",
        "engine.rl.steps=3",
        "engine.rl.grad_cos=true",
        "judge.noise.kind=flip",
        "judge.noise.p=0.5",
        "seed=0,1",
        "tracking.rollouts.every=0,1",
    )
    return done.folder, done.uri, done.client, done.parent, done.children


def test_two_runs_of_one_seed_pair_up_with_a_difference_of_exactly_0(sweep):
    tmp, uri, _, parent, children = sweep
    by_seed = {}
    for run in children:
        by_seed.setdefault(run.data.tags["slca.swept.seed"], []).append(run.data.metrics)
    for first, second in by_seed.values():  # the runs of a seed logged the same numbers
        # timings differ, only the job that trained the seed's SFT logs its loss, and only the
        # job that logs rollouts checks them for token drift

        def learnt_of(metrics):
            return {
                k
                for k in metrics
                if "perf/" not in k and not k.startswith("sft/") and "token_mismatch" not in k
            }

        learnt = learnt_of(first)
        assert learnt == learnt_of(second)
        for key in learnt:
            a, b = first[key], second[key]
            assert a == b or (math.isnan(a) and math.isnan(b)), key
    sweep_id = parent.data.tags["slca.sweep"]
    report = tmp / "report.md"
    args = [sweep_id, "--tracking-uri", uri, "--out", str(tmp / "cmp"), "--report", str(report)]
    args += [a for m in METRICS for a in ("--metric", m)]
    res = subprocess.run(
        [SLCA_EXE, "compare", *args], cwd=tmp, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    rows = (tmp / "cmp" / "differences.md").read_text().splitlines()[2:]
    assert len(rows) == len(METRICS)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[:2] == ["tracking.rollouts.every", "1 - 0"]
        assert cells[4:10] == ["2", "paired t", "+0", "[+0, +0]", "-", "identical"], cells
    text = report.read_text()
    assert "## Gradient conflict" in text and "train/grad_cos (mean over steps)" in text


def test_the_noisy_judge_is_logged_beside_the_judges_own_ratings(sweep, tmp_path):
    _, _, client, _, children = sweep
    perturbed = 0
    for run in children:
        rating = client.get_metric_history(run.info.run_id, "judge/rating")
        raw = client.get_metric_history(run.info.run_id, "judge/raw_rating")
        frac = client.get_metric_history(run.info.run_id, "judge/perturbed_frac")
        assert [m.step for m in rating] == [m.step for m in raw] == [m.step for m in frac]
        assert rating, "no step had a rated summary"
        perturbed += sum(a.value != b.value for a, b in zip(rating, raw, strict=True))
        recipe = Path(client.download_artifacts(run.info.run_id, "recipe.json", str(tmp_path)))
        noise = json.loads(recipe.read_text())["judge"]["noise"]
        assert noise == {"kind": "flip", "seed": None, "p": 0.5}
    assert perturbed > 0  # p=0.5 changed some step's mean rating
    logged = [r for r in children if r.data.tags["slca.swept.tracking.rollouts.every"] == "1"]
    rows = []
    for run in logged:
        files = [a.path for a in client.list_artifacts(run.info.run_id, "rollouts/train")]
        first = sorted(f for f in files if f.endswith(".json"))[0]
        path = client.download_artifacts(run.info.run_id, first, str(tmp_path))
        table = json.loads(Path(path).read_text())
        rating, raw = (table["columns"].index(c) for c in ("summary_rating", "judge_raw_rating"))
        rows += [(row[rating], row[raw]) for row in table["data"]]
    assert all((a is None) == (b is None) for a, b in rows)
    assert any(a is not None for a, _ in rows)
