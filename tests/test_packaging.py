"""The config tree ships inside the package: a built wheel finds conf/ from any directory."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_carries_the_config_tree_and_runs_from_anywhere(tmp_path):
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = (tmp_path / "dist").glob("slca_exp-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        files = set(zf.namelist())
        zf.extractall(tmp_path / "site")
    for name in (
        "config.yaml",
        "algorithm/slca_grpo.yaml",
        "algorithm/grpo.yaml",
        "algorithm/toolpo_grpo.yaml",
        "experiment/smoke.yaml",
    ):
        assert f"slca_exp/conf/{name}" in files
    # the vllm serve records of both builds (GPU and CPU services are checked against them)
    assert {"slca_exp/services/vllm_serve_options.json"} <= files
    assert {"slca_exp/services/vllm_serve_options_cpu.json"} <= files
    work = tmp_path / "elsewhere"
    work.mkdir()
    code = (
        "import sys, slca_exp; from slca_exp.commands import main; print(slca_exp.__file__); "
        "sys.exit(main(['validate', 'algorithm=grpo', 'experiment=smoke']))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=work,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert str(tmp_path / "site") in res.stdout and "valid" in res.stdout


def test_benchmark_script_runs_at_a_tiny_size():
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "estimators.py"),
            "--sizes",
            "8x32x4",
            "--rounds",
            "3",
            "--budget",
            "0.01",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "slca_grpo" in res.stdout and "reference / slca_grpo" in res.stdout
