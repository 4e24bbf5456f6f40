"""Bad recipes: ``train`` refuses each naming its key, before it starts and creating nothing;
``validate`` and ``train --dry-run`` refuse each with the very same problems."""

import os

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from slca_exp.commands import main
from tests.skip_policy import require

FOREIGN = "{foreign}"
"""Stands for a folder holding a split file the synthetic generator did not write."""

CASES = [
    (["algorithm=ppo"], "algorithm"),  # unknown option
    (["reward.tool_weights.name=-0.1"], "reward.tool_weights.name"),  # negative weight
    (["algorithm.group_size=1"], "algorithm.group_size"),  # a group of one with slca_grpo
    (
        ["data.kind=files", "data.files.train=missing.parquet", "data.files.val=missing.parquet"],
        "data.files.train",
    ),  # missing data file
    (["engine.rollout.max_response_tokens=20"], "engine.rollout.max_response_tokens"),
    (["engine.rollout.max_turn_tokens=8"], "engine.rollout.max_turn_tokens"),
    (["backbone.source=local", "backbone.path=/no/such/checkpoint"], "backbone.path"),
    (["backbone=qwen2.5-7b-instruct"], "backbone.path"),  # hub weights not in the local cache
    (["judge=openai", "judge.model=null"], "judge.model"),  # an HTTP judge without a model
    (["judge.api_key_env=sk-live-1234"], "judge.api_key_env"),  # a key where a name belongs
    (["engine.name=warp"], "engine.name"),  # no such engine
    (["engine.rl.lr=0"], "engine.rl.lr"),
    (["engine.rl.mask_rule=last"], "engine.rl.mask_rule"),
    (["tracking.backends=[mlflo]"], "tracking.backends[0]"),
    (["data=toucan"], "data.dir"),  # the paper's files, but no folder given
    (["data=toucan", "data.dir=/no/such/folder"], "data.files.train"),  # a folder not there
    (["+engine.rl.warmup=3"], "engine.rl.warmup"),  # a key the schema does not have
    (["reward.tool_weight.name=0.3"], "did you mean reward.tool_weights.name"),  # typo midway
    (["reward.tool_weights=0.5"], "a mapping of weights"),  # a value where a mapping belongs
    # a list of values without -m (Hydra's "Ambiguous value" once the run has started)
    (["reward.tool_weights.name=0.25,0.15", "reward.normalize=true"], "add -m"),
    (["sweep=hierr_presets"], "add -m"),  # a ready study is a sweep
    (["judge=openai", "judge.base_url=http://u:pw-42@127.0.0.1:9/v1"], "judge.api_key_env"),
    (["simulator=sgls", "simulator.base_url='http://127.0.0.1:9/v1?token=abc123'"], "token"),
    (["tracking.mlflow_uri=http://u:pw-42@127.0.0.1:5000"], "tracking.mlflow_uri"),
    (["launcher=slurm_gpu_8x", "launcher.nodez=2"], "did you mean launcher.nodes"),
    ([f"data.dir={FOREIGN}"], "were not generated here"),  # someone else's split files
    (["engine=verl"], "engine.verl.n_gpus_per_node"),  # verl's GPUs are not on this host
]

COMMANDS = (["train"], ["validate"], ["train", "--dry-run"])


@pytest.fixture
def here(tmp_path, monkeypatch):
    """An empty launch folder, an empty HF cache, no SLURM (a failing ``sinfo`` first on PATH)."""
    work, tools = tmp_path / "work", tmp_path / "tools"
    work.mkdir()
    tools.mkdir()
    (tools / "sinfo").write_text("#!/bin/sh\nexit 1\n")
    (tools / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(work)
    monkeypatch.setenv("SLCA_EXP_ROOT", str(work / "out"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "no-hf-cache"))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "train.parquet").write_bytes(b"not ours")
    return work, foreign


def refusals(capsys, work, foreign, overrides):
    """What each command prints for ``overrides``; each must exit 2 and create nothing."""
    overrides = [o.replace(FOREIGN, str(foreign)) for o in overrides]
    printed = []
    for command in COMMANDS:
        assert main([*command, *overrides]) == 2, command
        err = capsys.readouterr().err
        assert "fix:" in err and "Traceback" not in err
        assert list(work.iterdir()) == [] and sorted(p.name for p in foreign.iterdir()) == [
            "train.parquet"
        ], command
        printed.append(err)
    return printed


@pytest.mark.parametrize(("overrides", "expected"), CASES, ids=[c[1] for c in CASES])
def test_refused_alike_by_train_validate_and_dry_run_creating_nothing(
    here, capsys, overrides, expected
):
    if overrides == ["engine=verl"]:
        require("verl", reason="needs the verl extra")
        if torch.cuda.device_count() >= 8:
            pytest.skip("this host has the 8 GPUs engine=verl asks for")
    train, validate, dry_run = refusals(capsys, *here, overrides)
    assert expected in train
    assert validate == train and dry_run == train


_CHEAP = [c for c in CASES if c[0][0] not in ("engine=verl", "sweep=hierr_presets")]


@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.sampled_from(_CHEAP), min_size=2, max_size=3, unique_by=lambda c: c[0][0]))
def test_a_mix_of_bad_overrides_is_refused_alike(here, capsys, cases):
    overrides = [o for case, _ in cases for o in case]
    keys = {o.lstrip("+").split("=", 1)[0] for o in overrides}
    assume(len(keys) == len(overrides))  # the same key twice: the last one would win
    train, validate, dry_run = refusals(capsys, *here, overrides)
    assert validate == train and dry_run == train
