"""Bad recipes for a training run: each exits 2 naming its key, and nothing is created."""

import pytest

from slca_exp.cli import main

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
    (["+engine.rl.warmup=3"], "engine.rl.warmup"),  # a key the schema does not have
]


@pytest.mark.parametrize(("overrides", "key"), CASES, ids=[c[1] for c in CASES])
def test_refused_with_its_key_and_nothing_created(tmp_path, monkeypatch, capsys, overrides, key):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLCA_EXP_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "no-hf-cache"))
    assert main(["train", *overrides]) == 2
    err = capsys.readouterr().err
    assert key in err and "fix:" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
