"""``slca-exp eval``'s refusals: every problem named with its key before anything is served."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slca_exp.commands import eval as eval_command
from slca_exp.evaluation.benchmark import BFCL_CATEGORIES, Benchmark, benchmark_problems

EXE = str(Path(sys.executable).parent / "slca-exp")


def refused(capsys, *args) -> str:
    assert eval_command.main(list(args)) == 2
    return capsys.readouterr().err


def test_the_papers_category_names_are_refused_with_bfcls_own(capsys):
    err = refused(capsys, "some-run", "benchmark.categories=[simple,java,multiple]")
    assert "benchmark.categories" in err
    assert "simple is simple_python" in err and "java is simple_java" in err


def test_tau2_without_its_tasks_or_user_is_refused_naming_both(capsys):
    err = refused(capsys, "some-run", "benchmark=tau2")
    assert "benchmark.data_dir and benchmark.user_service" in err
    assert "slca-exp serve up" in err


def test_tau2_with_both_given_stops_saying_what_it_lacks(capsys, tmp_path):
    err = refused(
        capsys,
        "some-run",
        "benchmark=tau2",
        f"benchmark.data_dir={tmp_path}",
        "benchmark.user_service=user-sim",
        "eval=cpu",
    )
    assert "GitHub" in err and "unrelated" in err


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["benchmark.per_category=0"], "benchmark.per_category"),
        (["benchmark.categorys=[parallel]"], "benchmark.categorys"),
        (["benchmark=bfcl_v4"], "benchmark"),
        (["benchmark.version=2024.1.1"], "benchmark.version"),
        (["benchmark.categories=[parallel,parallel]"], "benchmark.categories"),
        (["benchmark.data_dir=/tmp"], "benchmark.data_dir"),
        (["eval.device=tpu"], "eval.device"),
        (["eval=cpu", "eval.extra_args=[--enforce-eagre]"], "eval.extra_args"),
        (["eval=gpu"], "eval.device"),  # the vLLM installed here is its CPU build
        (["judge.model=x"], "judge.model"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_key(capsys, args, key):
    err = refused(capsys, "some-run", *args)
    assert f"  {key}:" in err, err


def test_every_problem_is_reported_at_once(capsys):
    err = refused(
        capsys, "some-run", "eval=cpu", "benchmark.per_category=0", "eval.dtype=x", "x.y=1"
    )
    assert "(3 problems)" in err


def test_an_unknown_run_or_store_is_refused(tmp_path):
    missing = subprocess.run(
        [EXE, "eval", "nope", "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}", "eval=cpu"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert missing.returncode == 2 and "no MLflow store" in missing.stderr


def test_the_shipped_preset_is_the_papers_bfcl_v3_categories():
    from slca_exp.preflight.options import load_option

    preset, problems = load_option("benchmark", Benchmark, "bfcl_v3")
    assert problems == [] and benchmark_problems(preset) == []
    assert set(preset.categories) <= set(BFCL_CATEGORIES)
    paper = {
        "simple_python",
        "multiple",
        "parallel",
        "parallel_multiple",
        "simple_java",
        "simple_javascript",
        "live_simple",
        "live_multiple",
        "live_parallel",
        "live_parallel_multiple",
        "multi_turn_base",
        "multi_turn_miss_func",
        "multi_turn_miss_param",
    }
    assert set(preset.categories) == paper
