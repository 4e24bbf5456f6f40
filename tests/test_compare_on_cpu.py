"""``slca-exp compare``, run as a user runs it (the installed console script) on the store a real
2x2 ``slca-exp train -m`` wrote; plus seed averaging on runs created directly in MLflow."""

import json
import os
import re
import shutil
import subprocess
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from slca_exp.analysis.comparability import swept_components
from slca_exp.analysis.runs import find_runs, group_labels
from slca_exp.analysis.tables import format_table, plural
from slca_exp.commands.compare import main as compare_main
from slca_exp.tracking import lineage
from tests.tracking.sweeps import SLCA_EXE, run_train, shared_sweep


def compare(*args, cwd):
    return subprocess.run(
        [SLCA_EXE, "compare", *args], cwd=cwd, capture_output=True, text=True, timeout=180
    )


@pytest.fixture(scope="session")
def sweep(tmp_path_factory):
    return shared_sweep(tmp_path_factory)


def test_a_sweep_gives_a_four_row_table_plots_and_the_compare_url(sweep, tmp_path):
    out = tmp_path / "plots"
    res = compare(sweep.sweep_id, "--tracking-uri", sweep.uri, "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr  # only the swept components (reward) differ
    lines = res.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("run "))
    dashes = next(i for i, line in enumerate(lines) if line.startswith("----"))
    rows = lines[dashes + 1 : dashes + 5]
    assert lines[dashes + 5] == ""  # exactly 4 rows, then the differences
    assert lines[dashes + 6].startswith("differences between two levels, per cell")
    # one run per cell and level (one seed): a difference, but no interval
    assert "too few runs" in res.stdout
    for child in sweep.children:
        row = next(r for r in rows if r.startswith(child.info.run_id[:8]))
        cells = row.split()
        assert cells[1] == child.data.tags["slca.swept.algorithm"]
        assert cells[2] == child.data.tags["slca.swept.reward.tool_weights.parallel"]
        assert cells[3] == f"{child.data.metrics['reward/total/mean']:.4g}"  # final value
    for name in ("rewards.png", "advantages.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert (out / "table.md").read_text().count("\n") == 2 + 4
    # the console table fits 120 columns; table.md keeps the full column names
    assert max(len(line) for line in lines[header : dashes + 5]) <= 120, res.stdout
    assert "| reward/total/mean (final) |" in (out / "table.md").read_text()
    assert "4 runs;" in res.stdout
    encoded = re.search(r"MLflow compare page: (\S+)", res.stdout).group(1)
    assert not set(encoded.split("#", 1)[1]) & set('[]"'), encoded  # percent-encoded
    url = unquote(encoded)
    assert url.startswith("http://127.0.0.1:5000/#/compare-runs?runs=[")
    runs = json.loads(re.search(r"runs=(\[[^]]*\])", url).group(1))
    experiments = json.loads(re.search(r"experiments=(\[[^]]*\])", url).group(1))
    assert sorted(runs) == sorted(c.info.run_id for c in sweep.children)
    assert experiments == [sweep.parent.info.experiment_id]


@pytest.mark.parametrize("how", ["parent_run_id", "experiment_name"])
def test_a_parent_run_id_or_an_experiment_name_finds_the_same_runs(sweep, tmp_path, how):
    target = sweep.parent.info.run_id if how == "parent_run_id" else "slca-exp"
    # the default store: $SLCA_EXP_ROOT/mlflow.db, as `slca-exp train` uses it
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    res = subprocess.run(
        [SLCA_EXE, "compare", target, "--metric", "adv/tool/abs_mean", "--ui-url", "http://h:1"],
        cwd=tmp_path,
        env={**env, "SLCA_EXP_ROOT": str(sweep.root)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr
    assert "4 runs" in res.stdout and "adv/tool/abs_mean (best)" in res.stdout
    assert "http://h:1/#/compare-runs?runs=" in res.stdout
    for child in sweep.children:
        assert child.info.run_id in res.stdout
    assert (tmp_path / "outputs" / "compare").is_dir()


def rerun_job_3(sweep, tmp_path, override):
    """A copy of the sweep's store in which job 3 was re-run with ``override``.

    Returns the copy's URI, a client on it, the original job 3 (deleted from the copy) and the
    parent's children there (the re-run job in place of the original).
    """
    db = tmp_path / "mlflow.db"
    shutil.copy(sweep.root / "mlflow.db", db)
    uri = f"sqlite:///{db}"
    client = MlflowClient(uri)
    replaced = next(c for c in sweep.children if c.data.tags["slca.job"] == "3")
    job = replaced.data.tags["slca.overrides"].split()
    env = {"SLCA_EXP_PARENT_RUN_ID": sweep.parent.info.run_id, "SLCA_EXP_SWEEP_ID": sweep.sweep_id}
    args = [*job, override, f"tracking.mlflow_uri={uri}"]
    assert run_train(args, tmp_path / "root", tmp_path, env) == 0
    client.delete_run(replaced.info.run_id)
    children = client.search_runs(
        [sweep.parent.info.experiment_id],
        f"tags.`mlflow.parentRunId` = '{sweep.parent.info.run_id}'",
    )
    return uri, client, replaced, children


def test_changing_the_judge_in_one_child_makes_strict_refuse(sweep, tmp_path):
    # A copy of the sweep's store in which job 3 was re-run with the openai judge.
    uri, client, replaced, children = rerun_job_3(sweep, tmp_path, "judge=openai")
    judge = replaced.data.tags["slca.judge"]  # e.g. rubric@rubric-v1
    other = "openai:openai/gpt-oss-120b@hierr-judge-v1"
    assert sorted(c.data.tags["slca.judge"] for c in children) == [other] + [judge] * 3

    res = compare(sweep.sweep_id, "--tracking-uri", uri, "--strict", cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "runs differ in judge, which was not swept" in res.stderr
    assert f"'{judge} (backend=rubric, " in res.stderr and "in 3 runs (" in res.stderr
    assert f"'{other} (backend=openai, " in res.stderr and "in 1 run (" in res.stderr
    assert "judge.model" in res.stderr  # a differing field, from recipe.json
    assert "refusing to compare (--strict)" in res.stderr and res.stdout == ""

    res = compare(sweep.sweep_id, "--tracking-uri", uri, "--out", str(tmp_path), cwd=tmp_path)
    assert res.returncode == 0 and "warning: runs differ in judge" in res.stderr
    assert "MLflow compare page" in res.stdout


def test_a_noisy_judge_in_one_child_is_named_by_strict(sweep, tmp_path):
    uri, _, _, _ = rerun_job_3(sweep, tmp_path, "judge.noise.kind=gaussian")
    res = compare(sweep.sweep_id, "--tracking-uri", uri, "--strict", cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "runs differ in judge, which was not swept" in res.stderr
    assert "(differing fields: judge.noise)" in res.stderr


def test_unknown_target_store_or_metric_exits_2_with_a_message(sweep, tmp_path):
    res = compare("no-such-sweep", "--tracking-uri", sweep.uri, cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "no sweep id, parent run id or experiment named 'no-such-sweep'" in res.stderr
    assert "Experiments: Default, slca-exp" in res.stderr
    res = compare(
        sweep.sweep_id, "--tracking-uri", sweep.uri, "--metric", "reward/tool/maen", cwd=tmp_path
    )
    assert res.returncode == 2 and "--metric 'reward/tool/maen' is not a metric" in res.stderr
    assert "Did you mean 'reward/tool/mean'?" in res.stderr
    missing = tmp_path / "nowhere" / "mlflow.db"
    res = compare("x", "--tracking-uri", f"sqlite:///{missing}", cwd=tmp_path)
    assert res.returncode == 2 and f"no MLflow store at {missing}" in res.stderr
    assert not missing.exists()


def test_runs_that_differ_only_in_seed_are_averaged(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("seeds", artifact_location=(tmp_path / "art").as_uri())
    parent = client.create_run(
        exp, tags={"slca.sweep": "s1", "slca.role": "parent", "slca.swept": '["algorithm", "seed"]'}
    )
    finals = {("grpo", 1): 0.2, ("grpo", 2): 0.4, ("slca_grpo", 1): 0.5, ("slca_grpo", 2): 0.9}
    for (algo, seed), final in finals.items():
        run = client.create_run(exp, tags={"mlflow.parentRunId": parent.info.run_id})
        tags = {"slca.swept.algorithm": algo, "slca.swept.seed": str(seed), "slca.judge": "rubric"}
        metrics = [Metric("reward/total/mean", v, 0, s) for s, v in enumerate([0.1, 1.0, final])]
        client.log_batch(
            run.info.run_id,
            metrics=metrics,
            params=[Param("seed", str(seed)), Param("algorithm.name", algo)],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
    out_dir = tmp_path / "o"
    args = ["s1", "--tracking-uri", uri, "--out", str(out_dir), "--smooth", "0.6"]
    assert compare_main(args) == 0
    out = capsys.readouterr().out
    # the plots group the runs as the table does: one curve per algorithm, over its two seeds
    labels = group_labels(find_runs(client, "s1"))
    assert sorted(labels) == ["algorithm=grpo (n=2)", "algorithm=slca_grpo (n=2)"]
    assert (out_dir / "rewards.png").is_file()
    grpo = next(line for line in out.splitlines() if line.startswith("2 ") and "slca" not in line)
    slca = next(line for line in out.splitlines() if line.startswith("2 ") and "slca" in line)
    # mean and sample std of the final values; best is the max of each run's history (1.0)
    assert grpo.split() == ["2", "1,2", "grpo", "0.3", "+/-", "0.14", "1", "+/-", "0"]
    assert slca.split() == ["2", "1,2", "slca_grpo", "0.7", "+/-", "0.28", "1", "+/-", "0"]


def test_swept_keys_map_to_recipe_components():
    assert swept_components(["judge.model", "reward.tool_weights.parallel", "seed"]) == {
        "judge",
        "reward",
    }
    assert swept_components(["data"]) == {"data"}
    assert swept_components(["experiment"]) == {
        "backbone",
        "reward",
        "judge",
        "simulator",
        "data",
    }


CELL = st.text(st.sampled_from("ab0/._ -+"), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 15).flatmap(lambda n: st.tuples(
    st.lists(CELL, min_size=n, max_size=n),
    st.lists(st.lists(CELL, min_size=n, max_size=n), max_size=4),
)))  # fmt: skip
def test_the_console_table_fits_120_columns_whatever_the_names(table):
    header, rows = table
    text = format_table(header, rows)
    assert max(len(line) for line in text.splitlines()) <= 120


@settings(max_examples=100, deadline=None)
@given(CELL, st.integers(6, 40))
def test_a_wrapped_cell_keeps_every_character_in_order(text, width):
    lines = format_table(["x"], [[text]], width=width).splitlines()
    assert lines[0] == "x" and set(lines[1]) == {"-"}  # the header, its rule, then the cell
    cell = lines[2:]
    assert all(len(line) <= width for line in cell)
    assert "".join(cell).replace(" ", "") == text.replace(" ", "")


def test_counts_are_written_with_the_right_plural():
    assert [plural(n, "run") for n in (0, 1, 2)] == ["0 runs", "1 run", "2 runs"]


def test_compare_refuses_a_smoothing_weight_outside_0_1(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        compare_main(["s1", "--smooth", "1.5"])
    assert exit_.value.code == 2
    assert "--smooth 1.5 is outside [0, 1)" in capsys.readouterr().err


def test_a_child_with_another_data_seed_has_other_digests_and_strict_names_data(
    sweep, tmp_path, capsys
):
    # The sweep's children read the same splits: one digest per split, shared by all four.
    digests = [lineage.run_datasets(sweep.client.get_run(c.info.run_id)) for c in sweep.children]
    assert len(digests[0]) == 3 and all(d == digests[0] for d in digests)
    # A copy of the store in which job 3 was re-run on a split generated from another seed.
    uri, client, replaced, children = rerun_job_3(sweep, tmp_path, "data.seed=7")
    (child,) = [c for c in children if c.info.run_id not in {s.info.run_id for s in sweep.children}]
    reseeded = lineage.run_datasets(client.get_run(child.info.run_id))
    assert reseeded.keys() == digests[0].keys()
    assert all(reseeded[name] != digests[0][name] for name in reseeded)

    assert compare_main([sweep.sweep_id, "--tracking-uri", uri, "--strict"]) == 2
    err = capsys.readouterr().err
    assert "runs differ in data, which was not swept" in err
    assert "refusing to compare (--strict)" in err
