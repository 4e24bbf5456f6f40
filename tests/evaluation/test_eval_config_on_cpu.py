"""``slca-exp eval`` before anything is served: its refusals, each naming its key; the key its
scores are kept by; the items a sample draws."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.commands import eval as eval_command
from slca_exp.evaluation.benchmark import BFCL_CATEGORIES, Benchmark, benchmark_problems
from slca_exp.evaluation.bfcl_driver import sample
from slca_exp.evaluation.scoring import Checkpoint, eval_key
from slca_exp.evaluation.settings import EvalSettings

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


# --- what decides the scores, and which items are scored ----------------------------------------


CHECKPOINT = Checkpoint("r" * 32, "run", "m-1", 3, "/ckpt")
IDENTITY_CHANGES = {
    "categories": lambda b, s: (replace(b, categories=[*b.categories, "irrelevance"]), s),
    "per_category": lambda b, s: (replace(b, per_category=(b.per_category or 0) + 1), s),
    "seed": lambda b, s: (replace(b, seed=b.seed + 1), s),
    "temperature": lambda b, s: (replace(b, temperature=b.temperature + 0.5), s),
    "max_tokens": lambda b, s: (replace(b, max_tokens=(b.max_tokens or 0) + 1), s),
    "version": lambda b, s: (replace(b, version=b.version + ".post1"), s),
    "device": lambda b, s: (b, replace(s, device="cpu" if s.device == "cuda" else "cuda")),
    "dtype": lambda b, s: (b, replace(s, dtype="float32" if s.dtype != "float32" else "auto")),
    "max_model_len": lambda b, s: (b, replace(s, max_model_len=(s.max_model_len or 0) + 1)),
    "tool_call_parser": lambda b, s: (b, replace(s, tool_call_parser=s.tool_call_parser + "x")),
    "extra_args": lambda b, s: (b, replace(s, extra_args=[*s.extra_args, "--seed=1"])),
}
VOLATILE_CHANGES = {
    "threads": lambda b, s: (replace(b, threads=b.threads + 1), s),
    "launcher": lambda b, s: (b, replace(s, launcher="slurm_cpu")),
    "env_root": lambda b, s: (b, replace(s, env_root="/elsewhere")),
    "rescore": lambda b, s: (b, replace(s, rescore=not s.rescore)),
    "health_timeout_s": lambda b, s: (b, replace(s, health_timeout_s=s.health_timeout_s + 1)),
    "resources": lambda b, s: (b, replace(s, resources={"mem_gb": 8})),
}

benchmarks_ = st.builds(
    Benchmark,
    name=st.just("bfcl"),
    categories=st.lists(st.sampled_from(BFCL_CATEGORIES), min_size=1, max_size=4, unique=True),
    per_category=st.none() | st.integers(1, 50),
    seed=st.integers(0, 10**6),
    temperature=st.floats(0, 2),
    max_tokens=st.none() | st.integers(1, 4096),
    threads=st.integers(1, 64),
)
settings_ = st.builds(
    EvalSettings,
    device=st.sampled_from(["cuda", "cpu"]),
    dtype=st.sampled_from(["auto", "bfloat16", "float16", "float32"]),
    max_model_len=st.none() | st.integers(1, 10**5),
    extra_args=st.lists(st.sampled_from(["--enforce-eager", "--seed=0"]), max_size=2),
)


@settings(max_examples=60, deadline=None)
@given(benchmarks_, settings_)
def test_the_score_key_changes_with_what_decides_the_scores_and_only_with_that(b, s):
    key = eval_key(b, CHECKPOINT, s)
    for field, change in IDENTITY_CHANGES.items():
        assert (
            eval_key(
                *_swap(change(b, s)),
            )
            != key
        ), field
    for field, change in VOLATILE_CHANGES.items():
        assert eval_key(*_swap(change(b, s))) == key, field
    other = replace(CHECKPOINT, model_id="m-2")
    assert eval_key(b, other, s) != key
    # the run's name and folder do not identify the checkpoint; its logged model does
    assert eval_key(b, replace(CHECKPOINT, run_name="x", folder="/y"), s) == key


def _swap(pair):
    b, s = pair
    return b, CHECKPOINT, s


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 10**4), min_size=0, max_size=60, unique=True),
    st.none() | st.integers(1, 80),
    st.integers(0, 10**6),
    st.sampled_from(BFCL_CATEGORIES),
)
def test_the_sample_is_the_seeds_and_the_categorys_alone_in_bfcls_order(ids, n, seed, category):
    ids = [f"{category}_{i}" for i in ids]
    spec = {"per_category": n, "seed": seed}
    chosen = sample(ids, spec, category)
    assert chosen == sample(list(ids), dict(spec), category)  # the same call, the same items
    assert len(chosen) == (len(ids) if n is None else min(n, len(ids)))
    assert chosen == [i for i in ids if i in set(chosen)]  # a subset, in BFCL's order


def test_the_run_may_stand_anywhere_among_the_overrides_but_only_one(capsys):
    err = refused(capsys, "benchmark.per_category=0", "some-run", "eval=cpu")
    assert "benchmark.per_category" in err  # some-run was taken as the run, the rest as keys
    assert eval_command.main(["run-a", "run-b", "eval=cpu"]) == 2
    assert "one RUN_OR_SWEEP at a time (got run-a, run-b)" in capsys.readouterr().err


def test_prepare_env_checks_only_what_picks_the_environment(capsys):
    # eval=gpu (the default) is not refused here, although this vLLM is the CPU build: nothing
    # is served; a version slca-exp has not run is
    err = refused(capsys, "--prepare-env", "benchmark.version=2024.1.1")
    assert "benchmark.version" in err and "eval.device" not in err
    assert eval_command.main(["--prepare-env", "some-run"]) == 2
    assert "give no RUN_OR_SWEEP" in capsys.readouterr().err
