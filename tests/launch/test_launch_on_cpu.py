"""Cluster profiles, ready studies and the dry run, on CPU without SLURM."""

import os
import sys
from pathlib import Path

import pytest
from hydra import compose

from slca_exp.commands import main
from slca_exp.launch.command import plan, study_names
from slca_exp.launch.profiles import load_profile, profile_names
from slca_exp.preflight.compose import check_overrides, expand_sweeps, hydra_context

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_slurm_here(tmp_path_factory, monkeypatch):
    """A ``sinfo`` that fails, first on PATH: these tests hold whether or not SLURM runs here."""
    folder = tmp_path_factory.mktemp("no-slurm")
    (folder / "sinfo").write_text("#!/bin/sh\nexit 1\n")
    (folder / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


def test_the_repo_root_folders_are_the_packaged_ones():
    assert (REPO / "launchers").resolve() == REPO / "slca_exp" / "conf" / "launcher"
    assert (REPO / "sweeps").resolve() == REPO / "slca_exp" / "conf" / "sweep"


@pytest.mark.parametrize("name", ["local", "submitit_local", "slurm_cpu", "slurm_gpu_8x"])
def test_every_shipped_profile_loads(name):
    profile, problems = load_profile(name)
    assert problems == [] and profile is not None
    assert {"local", "submitit_local", "slurm_cpu", "slurm_gpu_8x", "slurm_gpu_4node"} <= set(
        profile_names()
    )


def test_a_slurm_profile_composes_the_submitit_slurm_launcher(monkeypatch):
    monkeypatch.setenv("SLURM_ACCOUNT", "proj42")
    unfolded = plan(["launcher=slurm_gpu_4node", "launcher.timeout_min=30", "seed=1"])
    assert unfolded.problems == []
    assert unfolded.overrides == ["seed=1", "hydra/launcher=slca_slurm_gpu_4node"]
    with hydra_context():
        cfg = compose("config", overrides=unfolded.overrides, return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.nodes, launcher.gpus_per_node, launcher.timeout_min) == (4, 8, 30)
    assert launcher.partition == "gpu" and launcher.account == "proj42"
    assert launcher.setup[0] == "module load cuda/12.4"


def test_submitit_local_and_local_profiles():
    with hydra_context():
        local = compose("config", plan(["launcher=submitit_local"]).overrides, True)
        basic = compose("config", plan(["seed=3"]).overrides, True)
    assert local.hydra.launcher._target_.endswith("LocalLauncher")
    assert basic.hydra.launcher._target_.endswith("BasicLauncher")


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["launcher=slurm_cpu", "launcher.gpus_per_node=2"], "launcher.gpus_per_node"),
        (["launcher=slurm_gpu_8x", "launcher.timeout_min=-10"], "launcher.timeout_min"),
        (["launcher=slurm_gpu_8x", "launcher.nodes=0"], "launcher.nodes"),
        (["launcher=slurm_gpu_8x", "launcher.nodez=2"], "launcher.nodez"),
        (["launcher=slurm_gpu_8x", "launcher.mem_gb=lots"], "launcher.mem_gb"),
        (["launcher=slurm_gpu_8x", "launcher.signal_delay_s=99999"], "launcher.signal_delay_s"),
        (["launcher=no_such_cluster"], "launcher"),
    ],
)
def test_a_bad_profile_exits_2_naming_the_key_and_creates_nothing(
    overrides, key, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "-m", "seed=1,2", *overrides]) == 2
    err = capsys.readouterr().err
    assert f"  {key}:" in err and "fix:" in err
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_partition_is_refused_when_sinfo_exists(tmp_path, monkeypatch):
    sinfo = tmp_path / "sinfo"
    sinfo.write_text("#!/bin/sh\necho cpu 64 512000\necho debug 8 32000+\n")
    sinfo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    _, problems = load_profile("slurm_gpu_8x")
    assert [p.key for p in problems] == ["launcher.partition"]
    assert "'gpu'" in problems[0].what and "cpu, debug" in problems[0].what
    assert load_profile("slurm_cpu")[1] == []


def test_a_job_no_node_of_its_partition_can_hold_is_refused(tmp_path, monkeypatch):
    sinfo = tmp_path / "sinfo"  # two node shapes in partition cpu: the largest counts
    sinfo.write_text("#!/bin/sh\necho cpu 2 16000\necho cpu 4 21000\n")
    sinfo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    _, problems = load_profile("slurm_cpu", ["launcher.cpus_per_task=8", "launcher.mem_gb=32"])
    assert [p.key for p in problems] == ["launcher.cpus_per_task", "launcher.mem_gb"]
    assert "largest node of partition 'cpu' has 4" in problems[0].what
    assert "at most 20" in problems[1].fix
    fits = ["launcher.cpus_per_task=2", "launcher.tasks_per_node=2", "launcher.mem_gb=20"]
    assert load_profile("slurm_cpu", fits)[1] == []


@pytest.mark.parametrize(
    ("study", "jobs"),
    [("reward_weights", 9), ("estimator_seeds", 6), ("hierr_presets", 4), ("isolation", 120)],
)
def test_every_study_expands_and_validates(study, jobs):
    assert study in study_names()
    unfolded = plan([f"sweep={study}"])
    assert unfolded.problems == [] and unfolded.study == study
    n, problems = check_overrides(unfolded.overrides)
    assert (n, problems) == (jobs, [])


def test_the_isolation_study_states_its_question_design_and_expected_outcome():
    from slca_exp.launch.command import STUDY_NOTES, study_notes

    notes = study_notes("isolation")
    assert sorted(notes) == sorted(STUDY_NOTES)
    assert all(len(v) > 100 for k, v in notes.items() if k != "margin")
    assert float(notes["margin"]) == 0.05  # the equivalence margin, stated before the runs
    assert study_notes("estimator_seeds") == {}


def test_the_command_line_wins_over_the_study():
    overrides = plan(["sweep=estimator_seeds", "seed=7"]).overrides
    assert overrides == ["algorithm=grpo,slca_grpo", "seed=7"]
    assert len(expand_sweeps(overrides)) == 2


def test_a_study_with_bad_points_is_refused_listing_every_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["train", "-m", "sweep=estimator_seeds", "algorithm.eps=0,1e-6"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "algorithm.eps" in err and "6 of 12 jobs" in err
    for algorithm in ("grpo", "slca_grpo"):
        for seed in (0, 1, 2):
            assert f"algorithm={algorithm} seed={seed} algorithm.eps=0" in err
    assert "algorithm.eps=1e-6" not in err.split("jobs:")[1].split("]")[0]
    assert list(tmp_path.iterdir()) == []


def test_a_study_needs_multirun(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "sweep=hierr_presets"]) == 2
    assert "add -m" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_dry_run_prints_jobs_resources_and_sbatch_and_creates_nothing(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURM_PARTITION", "a100")
    args = ["--dry-run", "-m", "launcher=slurm_gpu_8x", "launcher.timeout_min=90"]
    assert main(["train", *args, "sweep=hierr_presets"]) == 0
    out = capsys.readouterr().out
    assert "dry run of 4 jobs with launcher=slurm_gpu_8x" in out
    assert "#3: reward=hierr_value_heavy" in out and "gpus_per_node: 8" in out
    script = out.split("sbatch script:\n", 1)[1]
    assert script.startswith("#!/bin/bash")
    for line in (
        "#SBATCH --partition=a100",
        "#SBATCH --time=90",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --array=0-3%4",
        "#SBATCH --mem=512GB",
        "module load cuda/12.4",
    ):
        assert line in script
    assert "-m submitit.core._submit" in script
    assert list(tmp_path.iterdir()) == []


def test_dry_run_of_a_cpu_profile_asks_for_no_gpus(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--dry-run", "launcher=slurm_cpu", "seed=3"]) == 0
    script = capsys.readouterr().out.split("sbatch script:\n", 1)[1]
    assert "--gpus-per-node" not in script and "--array" not in script
    assert "#SBATCH --partition=cpu" in script and "#SBATCH --time=240" in script
    assert list(tmp_path.iterdir()) == []


def test_slurm_profiles_activate_the_submitting_environment_by_absolute_path(monkeypatch):
    monkeypatch.delenv("SLCA_EXP_VENV", raising=False)
    for name in ("slurm_cpu", "slurm_gpu_8x", "slurm_gpu_4node"):
        profile, problems = load_profile(name)
        assert not problems
        assert profile.setup[-1] == f"source {sys.prefix}/bin/activate"  # jobs start elsewhere
    monkeypatch.setenv("SLCA_EXP_VENV", "/opt/envs/slca")
    profile, _ = load_profile("slurm_cpu")
    assert profile.setup[-1] == "source /opt/envs/slca/bin/activate"
