"""``slca-exp compare``'s differences, dose-response plots and ``--report`` on runs made in MLflow
(the numbers are known, so the table is checked against scipy), and a study's parent run."""

import random
import re

import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from scipy import stats

from slca_exp.commands.compare import main as compare_main
from tests.tracking.sweeps import run_sweep

ALGOS = ("grpo", "slca_grpo")
LEVELS = ("0.0", "1.0")
METRIC = "val/reward/tool/mean"


@pytest.fixture
def store(tmp_path):
    """2 algorithms x 2 noise levels x seeds: at p=0.0 both algorithms ran seeds 0-2 (pairs);
    at p=1.0 grpo ran seeds 0-2 and slca_grpo seeds 3-5 (nothing pairs: Welch)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("iso", artifact_location=(tmp_path / "art").as_uri())
    swept = '["algorithm", "judge.noise.p", "seed"]'
    parent = client.create_run(
        exp, tags={"slca.sweep": "iso1", "slca.role": "parent", "slca.swept": swept}
    )
    rng = random.Random(5)
    finals, cos = {}, {}
    for algo in ALGOS:
        for level in LEVELS:
            seeds = (3, 4, 5) if (algo, level) == ("slca_grpo", "1.0") else (0, 1, 2)
            for seed in seeds:
                final = round(rng.uniform(0.3, 0.6), 6)
                history = [rng.uniform(-0.2, 0.2) for _ in range(4)]
                finals[algo, level, seed], cos[algo, level, seed] = final, history
                run = client.create_run(exp, tags={"mlflow.parentRunId": parent.info.run_id})
                tags = {
                    "slca.swept.algorithm": algo,
                    "slca.swept.judge.noise.p": level,
                    "slca.swept.seed": str(seed),
                    "slca.judge": "rubric",
                }
                metrics = [Metric(METRIC, v, 0, s) for s, v in enumerate([0.2, final])]
                metrics += [Metric("train/grad_cos", v, 0, s) for s, v in enumerate(history)]
                # the two norms: 2 and 3 at every step, so each run's and group's mean too
                metrics += [Metric("train/grad_norm_tool", 2.0, 0, s) for s in range(4)]
                metrics += [Metric("train/grad_norm_summary", 3.0, 0, s) for s in range(4)]
                client.log_batch(
                    run.info.run_id,
                    metrics=metrics,
                    params=[Param("seed", str(seed)), Param("algorithm.name", algo)],
                    tags=[RunTag(k, v) for k, v in tags.items()],
                )
                client.set_terminated(run.info.run_id)
    client.set_terminated(parent.info.run_id)
    return uri, finals, cos


def differences(path):
    """The rows of ``differences.md``: lists of cells."""
    lines = path.read_text().splitlines()[2:]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]


def test_each_cells_difference_is_what_scipy_computes(store, tmp_path, capsys):
    uri, finals, _ = store
    out_dir = tmp_path / "o"
    args = ["iso1", "--tracking-uri", uri, "--out", str(out_dir), "--metric", METRIC]
    assert compare_main(args) == 0
    out = capsys.readouterr().out
    assert "differences between two levels, per cell (paired t over shared seeds" in out
    rows = differences(out_dir / "differences.md")
    by_cell = {r[2]: r for r in rows if r[0] == "algorithm"}
    assert sorted(by_cell) == ["judge.noise.p=0.0", "judge.noise.p=1.0"]
    # p=0.0: seeds 0-2 pair up; the paired t test over slca_grpo - grpo
    a = [finals["grpo", "0.0", s] for s in (0, 1, 2)]
    b = [finals["slca_grpo", "0.0", s] for s in (0, 1, 2)]
    ref = stats.ttest_rel(b, a)
    ci = ref.confidence_interval(0.95)
    mean = f"{sum(y - x for x, y in zip(a, b, strict=True)) / 3:+.4g}"
    interval = f"[{ci.low:+.4g}, {ci.high:+.4g}]"
    assert by_cell["judge.noise.p=0.0"][:9] == [
        "algorithm",
        "slca_grpo - grpo",
        "judge.noise.p=0.0",
        METRIC,
        "3",
        "paired t",
        mean,
        interval,
        f"{ref.pvalue:.3g}",
    ]
    # p=1.0: no seed on both sides; Welch's t test
    a = [finals["grpo", "1.0", s] for s in (0, 1, 2)]
    b = [finals["slca_grpo", "1.0", s] for s in (3, 4, 5)]
    ref = stats.ttest_ind(b, a, equal_var=False)
    ci = ref.confidence_interval(0.95)
    row = by_cell["judge.noise.p=1.0"]
    assert row[4:6] == ["3+3", "Welch t"]
    assert row[7:9] == [f"[{ci.low:+.4g}, {ci.high:+.4g}]", f"{ref.pvalue:.3g}"]
    assert row[9].startswith("differs" if ref.pvalue < 0.05 else "not separated at n=6")
    # the noise level has two levels too: compared within each algorithm
    assert sorted(r[2] for r in rows if r[0] == "judge.noise.p") == [
        "algorithm=grpo",
        "algorithm=slca_grpo",
    ]
    for row in rows:  # the console shows the same rows
        assert row[6] in out and row[8] in out
    assert (out_dir / "dose_judge.noise.p.png").read_bytes()[:4] == b"\x89PNG"


def test_the_report_has_the_design_the_differences_the_plots_and_the_grad_cosine(
    store, tmp_path, capsys
):
    uri, _, cos = store
    report = tmp_path / "r" / "iso.md"
    args = ["iso1", "--tracking-uri", uri, "--out", str(tmp_path / "o"), "--report", str(report)]
    assert compare_main([*args, "--metric", METRIC]) == 0
    assert f"report: {report}" in capsys.readouterr().out
    text = report.read_text()
    for heading in ("## Design", "## Results", "## Differences", "## Gradient conflict"):
        assert heading in text, heading
    assert "- swept `judge.noise.p`: `0.0`, `1.0`" in text
    assert "| runs | 12 FINISHED |" in text
    for image in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (report.parent / image).is_file(), image
    assert "iso_files/dose_judge.noise.p.png" in text
    # grad cos: each run's mean over its steps, then the group's mean over its runs
    grpo = [sum(cos["grpo", "0.0", s]) / 4 for s in (0, 1, 2)]
    line = next(x for x in text.splitlines() if x.startswith("| algorithm=grpo judge.noise.p=0.0"))
    assert f"| 3 | {sum(grpo) / 3:+.3f} |" in line
    assert line.endswith("| 2 | 3 |"), (
        line
    )  # norms of g_tool and g_summary: means over steps and runs


def test_a_studys_parent_records_it_and_the_report_states_the_expected_outcome(tmp_path, capsys):
    from slca_exp.launch.command import study_notes

    # the study through the CLI (the synthetic engine of tests/tracking/sweeps.py): 4 jobs
    grid = ["sweep=isolation", "seed=0", "judge.noise.p=0.0,1.0"]
    sweep = run_sweep(tmp_path, grid=grid)
    assert sweep.parent.data.tags["slca.study"] == "isolation"
    assert len(sweep.children) == 4
    report = tmp_path / "study.md"
    args = [sweep.sweep_id, "--tracking-uri", sweep.uri, "--report", str(report)]
    assert compare_main([*args, "--out", str(tmp_path / "o")]) == 0
    text = report.read_text()
    assert text.startswith("# Study `isolation`")
    assert study_notes("isolation")["expected"] in text
    (line,) = [x for x in text.splitlines() if x.startswith("- every job: `")]
    shared = ["experiment=isolation", "judge.noise.kind=flip", "seed=0", "engine.val_rows=64"]
    given = line.removeprefix("- every job: `").rstrip("`").split()
    assert sorted(given) == sorted([*shared, "tracking.rollouts.val=64"])
    assert "Equivalence margin ±0.05 (the study's, stated before the runs)" in text


def test_how_a_difference_changes_along_a_numeric_factor_is_a_paired_t_over_seeds():
    from types import SimpleNamespace

    from slca_exp.analysis.differences import interactions
    from slca_exp.analysis.runs import seed_of, swept_value

    rng = random.Random(3)
    runs, values = [], {}
    for algo in ALGOS:
        for level in ("0.0", "0.5", "1.0"):
            for seed in range(4):
                tags = {
                    "slca.swept.algorithm": algo,
                    "slca.swept.judge.noise.p": level,
                    "slca.swept.seed": str(seed),
                }
                run = SimpleNamespace(
                    info=SimpleNamespace(run_id=f"{algo}{level}{seed}"),
                    data=SimpleNamespace(tags=tags, params={}),
                )
                runs.append(run)
                values[algo, level, seed] = rng.uniform(0.3, 0.6)

    def observe(run, metric):
        tags = run.data.tags
        key = tags["slca.swept.algorithm"], tags["slca.swept.judge.noise.p"]
        return values[(*key, int(tags["slca.swept.seed"]))]

    swept = ["algorithm", "judge.noise.p", "seed"]
    (found,) = interactions(runs, swept, [METRIC], observe, swept_value, seed_of)
    low = [values["slca_grpo", "0.0", s] - values["grpo", "0.0", s] for s in range(4)]
    high = [values["slca_grpo", "1.0", s] - values["grpo", "1.0", s] for s in range(4)]
    ref = stats.ttest_rel(high, low)
    assert found.label == (
        "(slca_grpo - grpo) at judge.noise.p=1.0 - (slca_grpo - grpo) at judge.noise.p=0.0"
    )
    assert (found.estimate.n, found.estimate.p) == (4, ref.pvalue)
    assert found.estimate.low == ref.confidence_interval(0.95).low
