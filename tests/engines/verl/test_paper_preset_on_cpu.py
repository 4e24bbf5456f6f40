"""``experiment=paper_7b``: every training value of the public SLCA-GRPO launcher, pinned.

The launcher is github.com/SLCA-GRPO/SLCA-GRPO at commit 68539c5:
``rl/slca_grpo/train_slca_grpo.sh`` (the RL stage, verl; its command-line values win over
``rl/slca_grpo/config/toucan_grpo.yaml``) and ``sft/qwen2_5_7b_split_sft.yaml`` (the SFT stage,
LLaMA-Factory, on the 8 GPUs of ``sft/train_sft.sh``). Each row names our key and its value in
the composed preset, the verl key it becomes and its value in the translated config, and where
the launcher sets it.
"""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paper_splits import toucan_named_folder
from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = pytest.mark.verl

from omegaconf import OmegaConf  # noqa: E402

from slca_exp.commands import main  # noqa: E402
from slca_exp.engines.verl import rl_config, sft_config  # noqa: E402
from slca_exp.engines.verl.checks import check_sft_config, check_verl_config  # noqa: E402
from slca_exp.engines.verl.compose import compose_verl, verl_config_dir  # noqa: E402
from slca_exp.engines.verl.keys import ACTOR, REF, ROLLOUT, TURNS  # noqa: E402
from slca_exp.engines.verl.schema import VerlConfig  # noqa: E402
from slca_exp.preflight.compose import compose_run  # noqa: E402
from slca_exp.preflight.validate import ConfigError, validate  # noqa: E402

SH = "train_slca_grpo.sh"
SFT = "qwen2_5_7b_split_sft.yaml"

RL = [
    # (our key, our value, verl key, verl value, where the launcher sets it)
    ("algorithm.group_size", 16, ROLLOUT + "n", 16, f"{SH}: ROLLOUT_N=16"),
    ("algorithm.name", "slca_grpo", "algorithm.adv_estimator", "slca_grpo", f"{SH}: slca_grpo"),
    (
        "algorithm.norm_by_std",
        True,
        "algorithm.norm_adv_by_std_in_grpo",
        True,
        f"{SH}: algorithm.norm_adv_by_std_in_grpo=true",
    ),
    ("engine.verl.nnodes", 4, "trainer.nnodes", 4, f"{SH}: NNODES=4"),
    ("engine.verl.n_gpus_per_node", 8, "trainer.n_gpus_per_node", 8, f"{SH}: N_GPUS_PER_NODE=8"),
    ("engine.verl.strategy", "fsdp", ACTOR + "strategy", "fsdp", f"{SH}: not set (verl's fsdp)"),
    (
        "engine.verl.train_batch_size",
        128,
        "data.train_batch_size",
        128,
        f"{SH}: TRAIN_BATCH_SIZE=128",
    ),
    (
        "engine.verl.ppo_mini_batch_size",
        32,
        ACTOR + "ppo_mini_batch_size",
        32,
        f"{SH}: PPO_MINI_BATCH_SIZE=32",
    ),
    (
        "engine.verl.ppo_micro_batch_size_per_gpu",
        1,
        ACTOR + "ppo_micro_batch_size_per_gpu",
        1,
        f"{SH}: PPO_MICRO_BATCH_SIZE_PER_GPU=1",
    ),
    (
        "engine.verl.log_prob_micro_batch_size_per_gpu",
        128,
        ROLLOUT + "log_prob_micro_batch_size_per_gpu",
        128,
        f"{SH}: {ROLLOUT}log_prob_micro_batch_size_per_gpu=128",
    ),
    (
        "engine.verl.log_prob_micro_batch_size_per_gpu",
        128,
        REF + "log_prob_micro_batch_size_per_gpu",
        128,
        f"{SH}: {REF}log_prob_micro_batch_size_per_gpu=128",
    ),
    (
        "engine.verl.max_prompt_length",
        24576,
        "data.max_prompt_length",
        24576,
        f"{SH}: MAX_PROMPT_LENGTH=24576",
    ),
    (
        "engine.verl.max_prompt_length",
        24576,
        ROLLOUT + "prompt_length",
        24576,
        f"{SH}: {ROLLOUT}prompt_length=${{MAX_PROMPT_LENGTH}} (verl's own interpolation)",
    ),
    (
        "engine.verl.max_response_length",
        8192,
        "data.max_response_length",
        8192,
        f"{SH}: MAX_RESPONSE_LENGTH=8192",
    ),
    (
        "engine.verl.max_response_length",
        8192,
        ROLLOUT + "response_length",
        8192,
        f"{SH}: {ROLLOUT}response_length=${{MAX_RESPONSE_LENGTH}} (verl's own interpolation)",
    ),
    (
        "engine.verl.filter_overlong_prompts",
        True,
        "data.filter_overlong_prompts",
        True,
        f"{SH}: data.filter_overlong_prompts=true",
    ),
    (
        "engine.verl.tensor_model_parallel_size",
        1,
        ROLLOUT + "tensor_model_parallel_size",
        1,
        f"{SH}: {ROLLOUT}tensor_model_parallel_size=1",
    ),
    (
        "engine.verl.gpu_memory_utilization",
        0.82,
        ROLLOUT + "gpu_memory_utilization",
        0.82,
        f"{SH}: GPU_MEMORY_UTILIZATION=0.82",
    ),
    (
        "engine.verl.max_model_len",
        32768,
        ROLLOUT + "max_model_len",
        32768,
        f"{SH}: MAX_MODEL_LEN=32768",
    ),
    ("engine.verl.max_num_seqs", 32, ROLLOUT + "max_num_seqs", 32, f"{SH}: MAX_NUM_SEQS=32"),
    (
        "engine.verl.prefix_caching",
        True,
        ROLLOUT + "enable_prefix_caching",
        True,
        f"{SH}: {ROLLOUT}enable_prefix_caching=true",
    ),
    (
        "engine.verl.chunked_prefill",
        True,
        ROLLOUT + "enable_chunked_prefill",
        True,
        f"{SH}: {ROLLOUT}enable_chunked_prefill=true",
    ),
    (
        "engine.verl.enforce_eager",
        True,
        ROLLOUT + "enforce_eager",
        True,
        f"{SH}: {ROLLOUT}enforce_eager=true",
    ),
    (
        "engine.verl.temperature",
        1.0,
        ROLLOUT + "temperature",
        1.0,
        f"{SH}: not set (verl's 1.0)",
    ),
    (
        "engine.verl.max_assistant_turns",
        10,
        TURNS + "max_assistant_turns",
        10,
        f"{SH}: {TURNS}max_assistant_turns=10",
    ),
    (
        "engine.verl.max_user_turns",
        6,
        TURNS + "max_user_turns",
        6,
        f"{SH}: {TURNS}max_user_turns=6",
    ),
    (
        "engine.verl.max_parallel_calls",
        20,
        TURNS + "max_parallel_calls",
        20,
        f"{SH}: {TURNS}max_parallel_calls=20",
    ),
    (
        "engine.verl.max_tool_response_length",
        2048,
        TURNS + "max_tool_response_length",
        2048,
        f"{SH}: {TURNS}max_tool_response_length=2048 (characters)",
    ),
    (
        "engine.verl.tool_response_truncate_side",
        "middle",
        TURNS + "tool_response_truncate_side",
        "middle",
        f"{SH}: {TURNS}tool_response_truncate_side=middle",
    ),
    (
        "engine.verl.agent_workers",
        32,
        ROLLOUT + "agent.num_workers",
        32,
        f"{SH}: {ROLLOUT}agent.num_workers=32",
    ),
    ("engine.verl.lr", 1e-6, ACTOR + "optim.lr", 1e-6, f"{SH}: ACTOR_LR=1e-6"),
    (
        "engine.verl.use_kl_loss",
        True,
        ACTOR + "use_kl_loss",
        True,
        f"{SH}: {ACTOR}use_kl_loss=true",
    ),
    (
        "engine.verl.kl_loss_coef",
        0.001,
        ACTOR + "kl_loss_coef",
        0.001,
        f"{SH}: KL_LOSS_COEF=0.001",
    ),
    (
        "engine.verl.kl_loss_type",
        "low_var_kl",
        ACTOR + "kl_loss_type",
        "low_var_kl",
        f"{SH}: {ACTOR}kl_loss_type=low_var_kl",
    ),
    (
        "engine.verl.use_kl_in_reward",
        False,
        "algorithm.use_kl_in_reward",
        False,
        f"{SH}: algorithm.use_kl_in_reward=false",
    ),
    ("engine.verl.total_epochs", 5, "trainer.total_epochs", 5, f"{SH}: TOTAL_EPOCHS=5"),
    ("engine.verl.save_freq", 10, "trainer.save_freq", 10, f"{SH}: SAVE_FREQ=10"),
    (
        "engine.verl.keep_checkpoints",
        8,
        "trainer.max_actor_ckpt_to_keep",
        8,
        f"{SH}: trainer.max_actor_ckpt_to_keep=8",
    ),
    ("engine.verl.test_freq", 10, "trainer.test_freq", 10, f"{SH}: TEST_FREQ=10"),
    (
        "engine.verl.val_before_train",
        True,
        "trainer.val_before_train",
        True,
        f"{SH}: VAL_BEFORE_TRAIN=true",
    ),
    ("engine.verl.val_n", 1, ROLLOUT + "val_kwargs.n", 1, f"{SH}: VAL_ROLLOUT_N=1"),
    (
        "engine.verl.val_do_sample",
        False,
        ROLLOUT + "val_kwargs.do_sample",
        False,
        f"{SH}: VAL_DO_SAMPLE=false",
    ),
    (
        "engine.verl.val_temperature",
        0.0,
        ROLLOUT + "val_kwargs.temperature",
        0.0,
        f"{SH}: not set (verl's 0)",
    ),
]
"""The RL stage: the launcher's values, as our keys and as verl's."""

SFT_ROWS = [
    ("engine.sft.lr", 5e-6, "optim.lr", 5e-6, f"{SFT}: learning_rate: 5e-6"),
    ("engine.sft.max_len", 16384, "data.max_length", 16384, f"{SFT}: cutoff_len: 16384"),
    (
        "engine.sft.batch_size",
        32,
        "data.train_batch_size",
        32,
        f"{SFT}: per_device_train_batch_size: 1 x gradient_accumulation_steps: 4 x 8 GPUs",
    ),
    (
        "engine.verl.sft_micro_batch_size_per_gpu",
        1,
        "data.micro_batch_size_per_gpu",
        1,
        f"{SFT}: per_device_train_batch_size: 1",
    ),
    (
        "engine.verl.sft_micro_batch_size_per_gpu",
        1,
        "data.use_dynamic_bsz",
        False,
        f"{SFT}: per_device_train_batch_size: 1 (fixed micro-batches)",
    ),
    ("engine.verl.sft_epochs", 2, "trainer.total_epochs", 2, f"{SFT}: num_train_epochs: 2.0"),
    (
        "engine.verl.sft_lr_scheduler",
        "cosine",
        "optim.lr_scheduler_type",
        "cosine",
        f"{SFT}: lr_scheduler_type: cosine",
    ),
    (
        "engine.verl.sft_warmup_ratio",
        0.1,
        "optim.lr_warmup_steps_ratio",
        0.1,
        f"{SFT}: warmup_ratio: 0.1",
    ),
    (
        "engine.verl.sft_weight_decay",
        0.0,
        "optim.weight_decay",
        0.0,
        f"{SFT}: weight_decay not set (transformers' TrainingArguments: 0.0)",
    ),
]
"""The SFT stage: the launcher's values, as our keys and as verl's."""

VERL_DEFAULTS = [
    # (verl key, value): the launcher sets these on verl's command line, to verl's own defaults,
    # which the translation keeps
    (ROLLOUT + "name", "vllm"),
    (ROLLOUT + "mode", "async"),
    (ROLLOUT + "free_cache_engine", True),
    (TURNS + "enable", True),
    (TURNS + "format", "hermes"),
    (ACTOR + "entropy_coeff", 0),  # verl writes it as an int
    (ACTOR + "policy_loss.loss_mode", "vanilla"),
    ("actor_rollout_ref.model.use_remove_padding", True),
    ("actor_rollout_ref.model.enable_gradient_checkpointing", True),
    ("actor_rollout_ref.model.use_shm", False),
    ("data.truncation", "error"),
    ("data.return_raw_chat", True),
    ("data.train_max_samples", -1),
    ("trainer.resume_mode", "auto"),
]

ROWS = 64
"""Rows of the tiny Toucan-like splits (the SFT split: 64 trajectories, 2 batches of 32)."""


def run_config(*overrides):
    """The typed config of ``experiment=paper_7b`` + ``overrides``."""
    return validate(compose_run(["experiment=paper_7b", *overrides]))


def ours(config, key):
    """Our key's value in the typed config."""
    value = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def same(found, expected):
    """Equal and of the same kind (``True`` is not ``1``, ``1`` is not ``1.0``)."""
    kind = float if isinstance(expected, float) else type(expected)
    return found == expected and isinstance(found, kind)


@pytest.fixture(scope="module")
def toucan(tmp_path_factory):
    """A folder holding tiny splits under the paper's Toucan file names."""
    return toucan_named_folder(tmp_path_factory, ROWS)


@pytest.mark.parametrize(("key", "value", "verl_key", "verl_value", "where"), RL)
def test_the_rl_stage_is_the_launchers(key, value, verl_key, verl_value, where):
    config = run_config("data.dir=/cluster/toucan")
    assert same(ours(config, key), value), where
    found = OmegaConf.select(rl_config.verl_config(config), verl_key, throw_on_missing=True)
    assert same(found, verl_value), where


@pytest.mark.parametrize(("key", "value", "verl_key", "verl_value", "where"), SFT_ROWS)
def test_the_sft_stage_is_the_launchers(key, value, verl_key, verl_value, where):
    config = run_config("data.dir=/cluster/toucan")
    assert same(ours(config, key), value), where
    found = OmegaConf.select(sft_config.sft_config(config), verl_key, throw_on_missing=True)
    assert same(found, verl_value), where


@pytest.mark.parametrize(("verl_key", "value"), VERL_DEFAULTS)
def test_what_the_launcher_sets_to_verls_default_is_kept(verl_key, value):
    assert same(OmegaConf.select(rl_config.verl_config(run_config()), verl_key), value)


def test_every_key_of_the_rl_table_is_pinned_and_verl_accepts_the_configs():
    config = run_config("data.dir=/cluster/toucan")
    pinned = {key.removeprefix("engine.verl.") for key, *_ in RL}
    modelled = set(rl_config.FIELD_KEYS) - {"total_training_steps"}  # null: verl's epochs decide
    assert modelled <= pinned
    assert config.engine.verl.total_training_steps is None
    assert {key.removeprefix("engine.verl.") for key, *_ in SFT_ROWS} >= set(sft_config.FIELD_KEYS)
    assert check_verl_config(rl_config.verl_config(config)) == []
    assert check_sft_config(sft_config.sft_config(config)) == []


def test_the_keys_the_preset_needs_default_to_verls_own_values():
    """A run that does not set them translates as before: to verl's defaults."""
    default, ppo = VerlConfig(), compose_verl(str(verl_config_dir()), "ppo_trainer")
    sft = compose_verl(str(verl_config_dir()), sft_config.CONFIG_NAME)
    for field in (
        "filter_overlong_prompts",
        "max_model_len",
        "max_num_seqs",
        "prefix_caching",
        "chunked_prefill",
        "enforce_eager",
        "max_user_turns",
        "max_tool_response_length",
        "tool_response_truncate_side",
        "agent_workers",
        "keep_checkpoints",
        "val_before_train",
        "val_n",
        "val_do_sample",
        "val_temperature",
    ):
        for key in rl_config.FIELD_KEYS[field]:
            assert getattr(default, field) == OmegaConf.select(ppo, key), (field, key)
    for field in ("sft_lr_scheduler", "sft_warmup_ratio", "sft_weight_decay"):
        (key,) = sft_config.FIELD_KEYS[field]
        assert getattr(default, field) == OmegaConf.select(sft, key), (field, key)
    # unset, the SFT stage's length and batching are engine.sft.steps and verl's dynamic batches
    assert default.sft_epochs is None and default.sft_micro_batch_size_per_gpu is None
    config = validate(compose_run(["engine=verl", "backbone=qwen2.5-7b-instruct"]))
    cfg = sft_config.sft_config(config)
    steps = config.engine.sft.steps
    assert (cfg.trainer.total_training_steps, cfg.trainer.total_epochs) == (steps, steps)
    assert cfg.data.use_dynamic_bsz is sft.data.use_dynamic_bsz is True
    assert cfg.data.micro_batch_size_per_gpu == sft.data.micro_batch_size_per_gpu
    assert {f.name for f in dataclasses.fields(VerlConfig)} >= set(sft_config.FIELD_KEYS)


def test_two_sft_epochs_are_counted_from_the_splits_rows(toucan):
    config = run_config(f"data.dir={toucan}")
    cfg = sft_config.sft_config(config)
    # verl drops the last incomplete batch: 2 epochs x (64 // 32) steps
    assert (cfg.trainer.total_epochs, cfg.trainer.total_training_steps) == (2, 4)
    assert sft_config.sft_checkpoint(cfg).parts[-2:] == ("global_step_4", "huggingface")
    assert check_sft_config(cfg) == []
    # the split not on this host: verl counts the steps of its 2 epochs itself
    cfg = sft_config.sft_config(run_config("data.dir=/cluster/toucan"))
    assert (cfg.trainer.total_epochs, cfg.trainer.total_training_steps) == (2, None)
    assert sft_config.sft_checkpoint(cfg).parts[-2] == "global_step_0"  # nothing saved yet
    # a split smaller than one batch has no step to train
    small = sft_config.sft_config(run_config(f"data.dir={toucan}", "engine.sft.batch_size=96"))
    assert small.trainer.total_training_steps == 0
    problems = check_sft_config(small)
    assert "trainer.total_training_steps" in [p.key for p in problems]


def test_the_sft_stage_length_is_set_once():
    with pytest.raises(ConfigError) as err:
        run_config("engine.sft.steps=10")
    (problem,) = err.value.problems
    assert problem.key == "engine.sft.steps"
    assert "engine.sft.steps=0" in problem.fix and "engine.verl.sft_epochs=null" in problem.fix
    # steps instead of epochs: the stage's length as without the preset
    cfg = sft_config.sft_config(run_config("engine.sft.steps=10", "engine.verl.sft_epochs=null"))
    assert (cfg.trainer.total_training_steps, cfg.trainer.total_epochs) == (10, 10)
    # with the SFT stage off, nothing is refused
    assert run_config("engine.sft.steps=10", "engine.sft.enabled=false").engine.sft.steps == 10


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("engine.verl.max_model_len=0", "engine.verl.max_model_len"),
        ("engine.verl.max_num_seqs=0", "engine.verl.max_num_seqs"),
        ("engine.verl.max_user_turns=0", "engine.verl.max_user_turns"),
        ("engine.verl.max_tool_response_length=0", "engine.verl.max_tool_response_length"),
        ("engine.verl.tool_response_truncate_side=top", "engine.verl.tool_response_truncate_side"),
        ("engine.verl.agent_workers=0", "engine.verl.agent_workers"),
        ("engine.verl.keep_checkpoints=0", "engine.verl.keep_checkpoints"),
        ("engine.verl.val_n=0", "engine.verl.val_n"),
        ("engine.verl.val_temperature=-1", "engine.verl.val_temperature"),
        ("engine.verl.sft_epochs=0", "engine.verl.sft_epochs"),
        ("engine.verl.sft_lr_scheduler=linear", "engine.verl.sft_lr_scheduler"),
        ("engine.verl.sft_warmup_ratio=1.5", "engine.verl.sft_warmup_ratio"),
        ("engine.verl.sft_micro_batch_size_per_gpu=0", "engine.verl.sft_micro_batch_size_per_gpu"),
        ("engine.verl.sft_weight_decay=-0.1", "engine.verl.sft_weight_decay"),
    ],
)
def test_out_of_range_values_are_refused_by_our_schema(override, key):
    with pytest.raises(ConfigError) as err:
        run_config(override)
    assert key in [p.key for p in err.value.problems]


SUBMITTED = ["experiment=paper_7b", "launcher=slurm_gpu_4node", "launcher.partition=null"]
"""A submission (no GPUs wanted on this host), its servers started with the job (--offline)."""


def test_train_cfg_job_prints_the_launchers_values(tmp_path, toucan):
    # A subprocess, as a user runs it: Hydra's --cfg leaves its global state set in a process.
    exe = Path(sys.executable).parent / "slca-exp"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["SLCA_EXP_ROOT"] = str(tmp_path / "out")
    res = subprocess.run(
        [str(exe), "train", *SUBMITTED, f"data.dir={toucan}", "--cfg", "job", "--offline"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    ours_text, theirs = res.stdout.split("# engine=verl: the translated verl config", 1)
    rl_text, sft_text = theirs.split("# engine=verl: the translated verl SFT config", 1)
    for line in (
        "max_prompt_length: 24576",
        "max_response_length: 8192",
        "gpu_memory_utilization: 0.82",
        "max_model_len: 32768",
        "max_num_seqs: 32",
        "agent_workers: 32",
        "total_epochs: 5",
        "save_freq: 10",
        "keep_checkpoints: 8",
        "sft_epochs: 2",
        "lr: 5.0e-06",
        "max_len: 16384",
    ):
        assert f"  {line}\n" in ours_text, line
    rl = OmegaConf.create(rl_text.split("\n", 1)[1])  # after the rest of the heading line
    for _, _, key, value, where in RL:
        assert same(OmegaConf.select(rl, key), value), where
    sft = OmegaConf.create(sft_text.split("\n", 1)[1])
    for _, _, key, value, where in SFT_ROWS:
        assert same(OmegaConf.select(sft, key), value), where
    assert sft.trainer.total_training_steps == 4  # 2 epochs x (64 // 32)
    assert list(tmp_path.iterdir()) == []


def test_train_dry_run_writes_the_launchers_verl_keys(tmp_path, toucan, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLCA_EXP_ROOT", str(tmp_path / "out"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["train", *SUBMITTED, f"data.dir={toucan}", "--dry-run", "--offline"]) == 0
    out = capsys.readouterr().out
    assert "verl config checked and written to" in out
    (rl_path,) = tmp_path.rglob("ppo_trainer.yaml")
    (sft_path,) = tmp_path.rglob("sft_trainer.yaml")
    rl, sft = OmegaConf.load(rl_path), OmegaConf.load(sft_path)
    assert check_verl_config(rl) == [] and check_sft_config(sft) == []
    for _, _, key, value, where in RL:
        assert same(OmegaConf.select(rl, key), value), where
    for _, _, key, value, where in SFT_ROWS:
        assert same(OmegaConf.select(sft, key), value), where
    assert sft.trainer.total_training_steps == 4
