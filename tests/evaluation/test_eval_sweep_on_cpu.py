"""``slca-exp eval`` on a sweep: every job's checkpoint scored by BFCL's own checker, then compare.

A real sweep on the local engine ({grpo, slca_grpo} x seeds {0, 1}, tiny sizes) trains four
checkpoints. Each is served in place of vLLM by ``answering_server.py`` (``eval.command``,
from an option file in ``--config-dir``): it answers BFCL's requests with tool calls built from
BFCL's own possible answers, correct for the slca_grpo runs and with one wrong argument value
for the grpo runs. Everything else is the real path: BFCL's environment, built by the product,
BFCL's client, generation and checker, the scores logged into each run, compare over them.
The checker must pass every correct answer and no wrong one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from slca_exp.evaluation.benchmark import BFCL_CATEGORIES
from slca_exp.evaluation.environment import BFCL_EXCLUDED, bfcl_folder
from tests.engines.test_engine_runs_on_cpu import TINY
from tests.evaluation.conftest import VERSION, cli, cli_env

pytestmark = pytest.mark.slow

EXE = str(Path(sys.executable).parent / "slca-exp")
SERVER = Path(__file__).with_name("answering_server.py")
CATEGORIES = ("simple_python", "multiple", "parallel")
PER_CATEGORY = 2
BENCHMARK = [
    f"benchmark.categories=[{','.join(CATEGORIES)}]",
    f"benchmark.per_category={PER_CATEGORY}",
    "benchmark.threads=2",
]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, bfcl_env):
    """The trained sweep, its store, and the option file that serves its checkpoints."""
    work = tmp_path_factory.mktemp("eval-sweep")
    env = cli_env(bfcl_env["root"])
    root = work / "out"
    res = cli(
        [
            EXE,
            "train",
            "-m",
            "algorithm=grpo,slca_grpo",
            "seed=0,1",
            "experiment=smoke",
            *TINY,
            "engine.rl.steps=1",
            f"tracking.root={root}",
            f"hydra.sweep.dir={work / 'multirun'}",
        ],
        work,
        env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    store = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(store)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    (parent,) = [r for r in runs if r.data.tags.get("slca.role") == "parent"]
    jobs = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(jobs) == 4
    site = next(bfcl_folder(bfcl_env["root"], VERSION).glob("lib/python*/site-packages"))
    answers = work / "answers.json"
    correct = [
        r.data.tags["mlflow.runName"]
        for r in jobs
        if r.data.params["algorithm.name"] == "slca_grpo"
    ]
    answers.write_text(
        json.dumps(
            {"package": str(site / "bfcl_eval"), "categories": CATEGORIES, "correct": correct}
        )
    )
    options = work / "conf" / "eval"
    options.mkdir(parents=True)
    command = [
        "{python}",
        str(SERVER),
        "--host",
        "{host}",
        "--port",
        "{port}",
        "--model",
        "{served_model_name}",
        "--answers",
        str(answers),
    ]
    (options / "answering.yaml").write_text(json.dumps({"command": command, "launcher": "local"}))
    return {
        "work": work,
        "env": env,
        "store": store,
        "client": client,
        "sweep_id": parent.data.tags["slca.sweep"],
        "jobs": jobs,
        "requests": Path(f"{answers}.requests"),
    }


def evaluate(sweep, *extra, target=None):
    """``slca-exp eval`` of the sweep (or of ``target``) through the answering server."""
    return cli(
        [
            EXE,
            "eval",
            target or sweep["sweep_id"],
            "--tracking-uri",
            sweep["store"],
            "--config-dir",
            str(sweep["work"] / "conf"),
            "eval=answering",
            *BENCHMARK,
            *extra,
        ],
        sweep["work"],
        sweep["env"],
    )


@pytest.fixture(scope="module")
def scored(sweep):
    """The dry run, then the eval of the whole sweep."""
    dry = evaluate(sweep, "--dry-run")
    requests_after_dry_run = sweep["requests"].exists()
    res = evaluate(sweep)
    assert res.returncode == 0, res.stderr[-4000:]
    return {"dry": dry, "requests_after_dry_run": requests_after_dry_run, "res": res}


def fresh(sweep, run):
    return sweep["client"].get_run(run.info.run_id)


def test_the_dry_run_names_every_checkpoint_and_its_server_and_starts_nothing(sweep, scored):
    dry = scored["dry"]
    assert dry.returncode == 0, dry.stderr
    assert not scored["requests_after_dry_run"]
    for job in sweep["jobs"]:
        assert f"run {job.info.run_id}" in dry.stdout
    assert dry.stdout.count("would serve: ") == 4
    assert str(SERVER) in dry.stdout and "--port <free>" in dry.stdout
    assert dry.stdout.count("would be scored and logged") == 4
    assert "categories: simple_python, multiple, parallel" in dry.stdout


def test_every_job_is_scored_by_bfcls_checker_correct_answers_pass_and_wrong_ones_do_not(
    sweep, scored
):
    for job in sweep["jobs"]:
        run = fresh(sweep, job)
        good = job.data.params["algorithm.name"] == "slca_grpo"
        for category in CATEGORIES:
            assert run.data.metrics[f"eval/bfcl/{category}"] == (1.0 if good else 0.0)
        assert run.data.metrics["eval/bfcl/overall"] == (1.0 if good else 0.0)
        history = sweep["client"].get_metric_history(job.info.run_id, "eval/bfcl/overall")
        final_step = max(
            m.step for m in sweep["client"].get_metric_history(job.info.run_id, "reward/tool/mean")
        )
        assert [m.step for m in history] == [final_step]
        tags = run.data.tags
        assert tags["slca.eval.bfcl.version"] == VERSION
        assert tags["slca.eval.bfcl.per_category"] == str(PER_CATEGORY)
        assert tags["slca.eval.bfcl.categories"] == ",".join(CATEGORIES)
        table = json.loads(
            Path(
                sweep["client"].download_artifacts(job.info.run_id, "eval/bfcl/items.json")
            ).read_text()
        )
        rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
        assert sorted(r["category"] for r in rows) == sorted(CATEGORIES * PER_CATEGORY)
        assert all(r["valid"] is good for r in rows)
        if not good:  # BFCL's own reason, per item
            assert all(r["error_type"] and r["error"] for r in rows), rows


def test_the_sample_is_the_same_items_for_every_run(sweep, scored):
    ids = set()
    for job in sweep["jobs"]:
        path = sweep["client"].download_artifacts(job.info.run_id, "eval/bfcl/items.json")
        table = json.loads(Path(path).read_text())
        ids.add(tuple(sorted(row[table["columns"].index("id")] for row in table["data"])))
    assert len(ids) == 1


def test_each_run_records_the_benchmark_environment_and_server_it_was_scored_with(sweep, scored):
    job = sweep["jobs"][0]
    record = json.loads(
        Path(sweep["client"].download_artifacts(job.info.run_id, "eval/bfcl/eval.json")).read_text()
    )
    assert record["benchmark"]["version"] == VERSION
    assert record["benchmark"]["categories"] == list(CATEGORIES)
    environment = record["environment"]
    assert environment["distribution"] == "bfcl-eval" and environment["version"] == VERSION
    installed = {line.split("==")[0].lower() for line in environment["packages"]}
    assert "bfcl-eval" in installed and "numpy" in installed
    # no second torch, and nothing the scored categories do not import
    assert not installed & {"torch", *BFCL_EXCLUDED}
    assert str(SERVER) in record["ran"]["server_command"]
    assert record["checkpoint"]["folder"] and record["checkpoint"]["step"] >= 1


def test_the_environment_was_built_once_while_another_eval_waited_for_it(bfcl_env):
    built = [out for out in bfcl_env["outputs"] if "building BFCL's environment" in out]
    assert len(built) == 1, bfcl_env["outputs"]
    folders = {line for out in bfcl_env["outputs"] for line in out.splitlines() if "folder" in line}
    assert len(folders) == 1


def test_prepare_env_finds_the_built_environment_and_says_where(bfcl_env, tmp_path):
    res = cli([EXE, "eval", "--prepare-env"], tmp_path, cli_env(bfcl_env["root"]), timeout=300)
    assert res.returncode == 0, res.stderr
    assert "building" not in res.stderr
    assert f"is ready: {bfcl_folder(bfcl_env['root'], VERSION)}" in res.stderr


def test_the_categories_offered_are_those_of_the_installed_bfcl(bfcl_env):
    python = bfcl_folder(bfcl_env["root"], VERSION) / "bin" / "python"
    code = (
        "import json; from bfcl_eval.constants.category_mapping import SINGLE_TURN_CATEGORY, "
        "MULTI_TURN_CATEGORY; print(json.dumps(SINGLE_TURN_CATEGORY + MULTI_TURN_CATEGORY))"
    )
    out = subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"BFCL_PROJECT_ROOT": str(bfcl_env["root"] / "probe")},
    )
    assert tuple(json.loads(out.stdout)) == BFCL_CATEGORIES


def test_compare_gives_the_paired_difference_of_each_category(sweep, scored, tmp_path):
    out = cli(
        [
            EXE,
            "compare",
            sweep["sweep_id"],
            "--tracking-uri",
            sweep["store"],
            "--out",
            str(tmp_path / "cmp"),
            "--report",
            str(tmp_path / "report.md"),
        ],
        sweep["work"],
        sweep["env"],
    )
    assert out.returncode == 0, out.stderr
    differences = (tmp_path / "cmp" / "differences.md").read_text()
    for category in (*CATEGORIES, "overall"):
        (line,) = [
            row
            for row in differences.splitlines()
            if f"eval/bfcl/{category}" in row and "slca_grpo - grpo" in row
        ]
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[4:7] == ["2", "paired t", "+1"], line  # two seeds paired, +1 each
    report = (tmp_path / "report.md").read_text()
    assert "## Benchmark scores" in report and f"version `{VERSION}`" in report


def test_a_second_eval_keeps_the_scores_and_rescore_scores_again(sweep, scored):
    before = sweep["requests"].read_text().count("\n")
    assert before == 4 * len(CATEGORIES) * PER_CATEGORY
    again = evaluate(sweep)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("scores kept") == 4
    assert sweep["requests"].read_text().count("\n") == before
    job = sweep["jobs"][0]
    rescored = evaluate(sweep, "eval.rescore=true", target=job.info.run_id)
    assert rescored.returncode == 0, rescored.stderr
    after = sweep["requests"].read_text().count("\n")
    assert after == before + len(CATEGORIES) * PER_CATEGORY
    history = sweep["client"].get_metric_history(job.info.run_id, "eval/bfcl/overall")
    assert len(history) == 2


def test_a_cpu_eval_of_checkpoints_whose_heads_vllm_cannot_run_is_refused(sweep):
    res = cli(
        [EXE, "eval", sweep["sweep_id"], "--tracking-uri", sweep["store"], "eval=cpu", *BENCHMARK],
        sweep["work"],
        sweep["env"],
    )
    assert res.returncode == 2
    assert "eval.device" in res.stderr and "16 wide" in res.stderr
    assert "backbone.arch.num_heads=2" in res.stderr


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm")
def test_an_eval_on_slurm_scores_in_a_job_of_its_own(sweep, scored):
    job = sweep["jobs"][1]
    before = len(sweep["client"].get_metric_history(job.info.run_id, "eval/bfcl/overall"))
    res = evaluate(
        sweep,
        "eval.rescore=true",
        "eval.launcher=slurm_cpu",
        "eval.resources={mem_gb: 2}",
        target=job.info.run_id,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "SLURM job " in res.stderr and "logged to the run" in res.stderr
    history = sweep["client"].get_metric_history(job.info.run_id, "eval/bfcl/overall")
    assert len(history) == before + 1
    (log,) = (sweep["work"] / "outputs" / "eval" / "jobs").glob("*/*_log.err")
    assert "serving" in log.read_text() and "scoring" in log.read_text()  # on the node


def test_a_run_with_eval_after_train_is_scored_in_its_own_job(sweep, tmp_path):
    answers = tmp_path / "answers.json"
    spec = json.loads((sweep["work"] / "answers.json").read_text())
    answers.write_text(json.dumps({**spec, "correct": ["*"]}))
    command = ",".join(
        f"'{part}'"
        for part in (
            "{python}",
            SERVER,
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--model",
            "{served_model_name}",
            "--answers",
            answers,
        )
    )
    root = tmp_path / "out"
    res = cli(
        [
            EXE,
            "train",
            "experiment=smoke",
            *TINY,
            "engine.rl.steps=1",
            f"tracking.root={root}",
            "eval.after_train=true",
            "eval.serving=cpu",
            f'eval.overrides=["eval.command=[{command}]",'
            f'"benchmark.categories=[{",".join(CATEGORIES)}]","benchmark.per_category=1"]',
        ],
        tmp_path,
        sweep["env"],
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "logged to the run" in res.stdout
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    (run_,) = [
        r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
    ]
    assert run_.info.status == "FINISHED"
    assert run_.data.metrics["eval/bfcl/overall"] == 1.0
    assert run_.data.tags["slca.eval.bfcl.per_category"] == "1"
    # the checkpoint's folder gone from this machine: its copy in MLflow is scored instead
    from slca_exp.evaluation.scoring import checkpoint_of

    outputs = client.get_run(run_.info.run_id).outputs.model_outputs
    (model,) = [client.get_logged_model(o.model_id) for o in outputs]
    folder = Path(model.tags["slca.path"].removeprefix("file://"))
    folder.rename(folder.with_name("moved"))
    found = checkpoint_of(client, run_, tmp_path / "scratch")
    assert Path(found.folder).is_relative_to(tmp_path / "scratch")
    assert (Path(found.folder) / "config.json").is_file()
    assert found.model_id == model.model_id
