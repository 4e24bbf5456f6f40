"""``engine=verl``: the run config translated into verl's PPO config, checked by verl on CPU."""

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = pytest.mark.verl

from omegaconf import OmegaConf, open_dict  # noqa: E402

from slca_exp.commands import main  # noqa: E402
from slca_exp.engines.verl import cpu  # noqa: E402
from slca_exp.engines.verl import rl_config as verl  # noqa: E402
from slca_exp.engines.verl import sft_config as sft  # noqa: E402
from slca_exp.engines.verl.checks import check_verl_config  # noqa: E402
from slca_exp.engines.verl.compose import compose_verl, verl_config_dir  # noqa: E402
from slca_exp.engines.verl.rl_config import verl_config  # noqa: E402
from slca_exp.engines.verl.schema import VerlConfig  # noqa: E402
from slca_exp.preflight.compose import compose_run, hydra_context  # noqa: E402
from slca_exp.preflight.validate import ConfigError, validate  # noqa: E402

PLUGIN = "slca_exp.engines.verl.plugin"


def run_config(*overrides):
    """The typed config of ``experiment=paper_7b`` + ``overrides``."""
    config = validate(compose_run(["experiment=paper_7b", *overrides]))
    assert config.engine.name == "verl"
    return config


def keys(problems):
    return [p.key for p in problems]


def test_paper_7b_translates_to_a_config_verl_accepts():
    cfg = verl_config(run_config("data.dir=/cluster/toucan"))
    assert check_verl_config(cfg) == []
    rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-7B-Instruct"
    assert (rollout.name, rollout.n, cfg.data.train_batch_size) == ("vllm", 16, 128)
    assert actor.optim.lr == 1e-6 and actor.strategy == "fsdp"
    assert (actor.use_kl_loss, actor.kl_loss_coef, actor.kl_loss_type) == (
        True,
        0.001,
        "low_var_kl",
    )
    assert cfg.algorithm.use_kl_in_reward is False and cfg.algorithm.kl_penalty == "low_var_kl"
    turns = rollout.multi_turn
    assert (turns.enable, turns.format, turns.max_assistant_turns, turns.max_parallel_calls) == (
        True,
        "hermes",
        10,
        20,
    )
    # our agent loop and reward manager put R_tool and R_sum at their segments' ends
    assert rollout.agent.default_agent_loop == "slca_tool_agent"
    assert rollout.agent.agent_loop_config_path.endswith("/verl/agent_loops.yaml")
    manager = cfg.reward.reward_manager
    assert (manager.source, manager.name) == ("importlib", "SLCARewardManager")
    assert cfg.slca_exp.judge.backend == "openai" and cfg.slca_exp.reward.variant == "paper"
    assert cfg.slca_exp.simulator.backend == "sgls"
    assert turns.tool_config_path.endswith("/verl/tools.yaml")
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (4, 8)
    # verl reads copies with extra_info.tools_kwargs, written at launch from our splits (which
    # need not exist here)
    assert cfg.data.train_files.endswith("/verl/data/train.parquet")
    assert cfg.data.val_files.endswith("/verl/data/val.parquet")
    assert cfg.slca_exp.data.train == "/cluster/toucan/rl.parquet"
    assert cfg.slca_exp.data.val == "/cluster/toucan/eval_4k.parquet"
    assert cfg.trainer.v1.trainer_mode == "slca_sync"  # verl's sync trainer + our metrics
    assert cfg.critic.enable is False
    # verl's own defaults are kept where we set nothing
    assert actor.clip_ratio == 0.2 and cfg.trainer.use_v1 is True


def test_the_estimator_and_its_parameters_travel_under_algorithm():
    cfg = verl_config(run_config("algorithm.tool_weight=0.5", "algorithm.norm_by_std=false"))
    assert cfg.algorithm.adv_estimator == "slca_grpo"
    assert cfg.algorithm.norm_adv_by_std_in_grpo is False
    assert OmegaConf.to_container(cfg.algorithm.slca) == {
        "tool_weight": 0.5,
        "summary_weight": 1.0,
        "norm_by_std": False,
        "eps": 1e-6,
        "toolpo_lambda": 1.0,
        "mask_rule": "parity",
    }
    toolpo = verl_config(run_config("algorithm=toolpo_grpo", "algorithm.toolpo_lambda=0.3"))
    assert toolpo.algorithm.adv_estimator == "toolpo_grpo"
    assert toolpo.algorithm.slca.toolpo_lambda == 0.3
    assert verl_config(run_config("algorithm=grpo")).algorithm.adv_estimator == "grpo"
    assert verl_config(run_config("algorithm.group_size=4")).actor_rollout_ref.rollout.n == 4


@pytest.mark.parametrize(
    ("estimator", "loop"),
    [("slca_grpo", "slca_tool_agent"), ("toolpo_grpo", "slca_tool_agent"), ("grpo", "tool_agent")],
)
def test_the_agent_loop_follows_the_estimator_and_verl_accepts_it(estimator, loop):
    # ours read R_tool and R_sum at their segments' ends; verl's grpo reads the reward side's
    # weighted total on the last token, which verl's own tool agent loop writes
    cfg = verl_config(run_config(f"algorithm={estimator}", "data.dir=/cluster/toucan"))
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == loop
    assert check_verl_config(cfg) == []
    assert verl.SOURCES["actor_rollout_ref.rollout.agent.default_agent_loop"].startswith(
        "algorithm.name"
    )


def test_the_plugin_travels_to_every_ray_worker(monkeypatch):
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "my_lab.verl_bits")
    monkeypatch.setenv("SLCA_EXP_PLUGINS", "my_lab.estimators")
    env = verl_config(run_config()).ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_USE_EXTERNAL_MODULES.split(",") == ["my_lab.verl_bits", PLUGIN]
    assert env.SLCA_EXP_PLUGINS == "my_lab.estimators"
    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES")
    monkeypatch.delenv("SLCA_EXP_PLUGINS")
    env = verl_config(run_config()).ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_USE_EXTERNAL_MODULES == PLUGIN and "SLCA_EXP_PLUGINS" not in env


def test_loggers_project_and_run_name_follow_tracking(tmp_path):
    cfg = verl_config(
        run_config("tracking=mlflow_wandb", "run_name=seed-1", f"tracking.root={tmp_path}")
    )
    assert list(cfg.trainer.logger) == ["mlflow", "wandb"]
    assert (cfg.trainer.project_name, cfg.trainer.experiment_name) == ("paper-7b", "seed-1")
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.MLFLOW_TRACKING_URI.endswith(f"{tmp_path}/mlflow.db") and env.WANDB_MODE
    assert cfg.trainer.default_local_dir.startswith(str(tmp_path / "runs"))
    assert list(verl_config(run_config("tracking=console")).trainer.logger) == ["console"]


def test_overrides_are_applied_last_with_hydra_semantics():
    config = run_config()
    config.engine.verl.overrides = [
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.rollout.n=8",  # wins over algorithm.group_size
        "+algorithm.slca.note=x",
        "~trainer.rollout_data_dir",
    ]
    cfg = verl_config(config)
    assert cfg.actor_rollout_ref.actor.entropy_coeff == 0.01
    assert cfg.actor_rollout_ref.rollout.n == 8 and cfg.algorithm.slca.note == "x"
    assert "rollout_data_dir" not in cfg.trainer


def test_bad_overrides_are_all_reported_with_their_index():
    config = run_config()
    config.engine.verl.overrides = [
        "actor_rollout_ref.actor.clip_ratoi=0.3",
        "model_engine=megatron",
        "+trainer.nnodes=2",
        "nonsense",
    ]
    with pytest.raises(ConfigError) as err:
        verl_config(config)
    assert keys(err.value.problems) == [f"engine.verl.overrides[{i}]" for i in range(4)]
    assert "did you mean actor_rollout_ref.actor.clip_ratio" in err.value.problems[0].fix


@pytest.mark.parametrize(
    ("overrides", "key", "ours"),
    [
        (
            ["engine.verl.train_batch_size=129"],
            "data.train_batch_size",
            "engine.verl.train_batch_size",
        ),
        (
            ["engine.verl.tensor_model_parallel_size=3"],
            "actor_rollout_ref.rollout.tensor_model_parallel_size",
            "engine.verl.tensor_model_parallel_size",
        ),
        (
            ["engine.verl.ppo_mini_batch_size=256"],
            "actor_rollout_ref.actor.ppo_mini_batch_size",
            "engine.verl.ppo_mini_batch_size",
        ),
        (
            ["engine.verl.ppo_mini_batch_size=3", "engine.verl.n_gpus_per_node=7"],
            "actor_rollout_ref.actor.ppo_mini_batch_size",
            "algorithm.group_size",
        ),
    ],
)
def test_verl_refuses_bad_values_naming_the_verl_key_and_ours(overrides, key, ours):
    problems = check_verl_config(verl_config(run_config(*overrides)))
    assert key in keys(problems)
    assert ours in next(p for p in problems if p.key == key).fix


def test_what_verl_refuses_in_overrides_or_names_is_reported_too():
    config = run_config()
    config.engine.verl.overrides = [
        "actor_rollout_ref.rollout.temperature=0",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.mode=sync",
        "trainer.logger=[mlflow,tb]",
    ]
    config.algorithm.name = "no_such_estimator"
    found = keys(check_verl_config(verl_config(config)))
    assert found == [
        "actor_rollout_ref.rollout.temperature",
        "actor_rollout_ref.rollout.mode",
        "algorithm.adv_estimator",
        "trainer.logger[1]",
    ]


def test_the_corrected_mask_rule_needs_our_trainer_and_says_so():
    cfg = verl_config(run_config("engine.verl.mask_rule=corrected"))
    assert cfg.algorithm.slca.mask_rule == "corrected" and check_verl_config(cfg) == []
    stock = run_config(
        "engine.verl.mask_rule=corrected", "engine.verl.overrides=['trainer.v1.trainer_mode=sync']"
    )
    (problem,) = check_verl_config(verl_config(stock))
    assert problem.key == "trainer.v1.trainer_mode" and "mask_rule=parity" in problem.fix
    # an unknown rule is refused by our schema before verl is involved
    with pytest.raises(ConfigError) as err:
        run_config("engine.verl.mask_rule=other")
    assert keys(err.value.problems) == ["engine.verl.mask_rule"]


def test_a_builtin_backbone_runs_on_verl_from_its_cached_checkpoint(tmp_path):
    config = run_config("backbone=tiny", "data=synthetic", f"tracking.root={tmp_path}")
    folder = Path(verl_config(config).actor_rollout_ref.model.path)
    assert folder.is_relative_to(tmp_path / "cache" / "backbones")
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    assert Path(verl_config(config).actor_rollout_ref.model.path) == folder  # built once


def test_a_hub_backbone_without_a_path_is_refused():
    with pytest.raises(ConfigError) as err:
        verl_config(run_config("backbone.path="))
    assert keys(err.value.problems) == ["backbone.path"]


def test_every_modelled_key_is_one_of_verls():
    cfg = verl_config(run_config())
    on_cpu = verl_config(run_config("engine.verl.backend=cpu"))  # the cpu backend's keys
    for key in verl.SOURCES.keys() | verl.FIXED.keys():
        parent, _, leaf = key.rpartition(".")
        assert leaf in OmegaConf.select(on_cpu if key in cpu.KEYS else cfg, parent), key
    # not one verl key each
    ours = {"backend", "cpu_rollout", "dump_batches", "mask_rule", "overrides", "sft_overrides"}
    modelled = {f.name for f in dataclasses.fields(VerlConfig)} - ours
    # the SFT stage's: in verl's SFT config (sft_config.py)
    assert modelled == set(verl.FIELD_KEYS) | set(sft.FIELD_KEYS)
    assert not set(verl.FIELD_KEYS) & set(sft.FIELD_KEYS)
    assert all(field.startswith("sft_") for field in sft.FIELD_KEYS)


def test_verl_never_converts_algorithm_to_its_dataclass():
    """``algorithm.slca`` relies on it: ``AlgoConfig`` refuses the extra key."""
    from verl.utils.config import omega_conf_to_dataclass

    with pytest.raises(Exception, match="slca"):
        omega_conf_to_dataclass(verl_config(run_config()).algorithm)
    source = Path(verl_config_dir()).parents[1]
    pattern = re.compile(r"omega_conf_to_dataclass\([^)]*algorithm\s*\)|(?<!class )AlgoConfig\(")
    hits = [p for p in source.rglob("*.py") if pattern.search(p.read_text(errors="ignore"))]
    assert hits == []


def test_composing_verls_config_leaves_a_running_hydra_alone():
    from hydra import compose

    config = run_config()
    compose_verl.cache_clear()
    with hydra_context():
        verl_config(config)
        assert compose(config_name="config").engine.name == "local"


SUBMITTED_7B = [
    "experiment=paper_7b",
    "data=synthetic",
    "launcher=slurm_gpu_8x",
    "launcher.partition=null",  # whatever SLURM this host has: its default partition
]


def test_train_cfg_job_prints_ours_then_the_verl_config(tmp_path):
    # A subprocess, as a user runs it: Hydra's --cfg leaves its global state set in a process.
    exe = shutil.which("slca-exp") or str(Path(sys.executable).parent / "slca-exp")
    # A cluster submission (no GPUs wanted here), its servers started with the job (--offline),
    # the synthetic split (the paper's files are not here: it is reported as to be generated).
    res = subprocess.run(
        [exe, "train", *SUBMITTED_7B, "--cfg", "job", "--offline"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    ours, theirs = res.stdout.split("# engine=verl: the translated verl config", 1)
    assert "name: verl" in ours and "experiment_name: paper-7b" in ours
    assert "adv_estimator: slca_grpo" in theirs and "actor_rollout_ref:" in theirs
    assert "# engine=verl: the translated verl SFT config" in theirs
    assert list(tmp_path.iterdir()) == []


def test_train_dry_run_writes_the_checked_verl_config_and_nothing_else(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLCA_EXP_ROOT", str(tmp_path / "out"))
    assert main(["train", *SUBMITTED_7B, "--dry-run", "--offline"]) == 0
    out = capsys.readouterr().out
    files = {p.name: p for p in tmp_path.rglob("*") if p.is_file()}
    # the synthetic split is generated at launch, not here: so are its tool config and data
    # copies
    assert set(files) == {"ppo_trainer.yaml", "agent_loops.yaml", "sft_trainer.yaml"}
    assert "verl SFT config checked and written to" in out
    written = files["ppo_trainer.yaml"]
    assert written.relative_to(tmp_path / "out").parts[::2] == ("runs", "verl")
    assert str(written) in out and str(files["agent_loops.yaml"]) in out
    assert files["agent_loops.yaml"].parent == written.parent
    cfg = OmegaConf.load(written)
    assert check_verl_config(cfg) == [] and cfg.actor_rollout_ref.rollout.n == 16


def test_train_dry_run_refuses_what_verl_refuses_creating_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLCA_EXP_ROOT", str(tmp_path / "out"))
    args = ["train", *SUBMITTED_7B, "engine.verl.tensor_model_parallel_size=3"]
    assert main([*args, "--dry-run", "--offline"]) == 2
    err = capsys.readouterr().err
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size" in err and "fix:" in err
    assert list(tmp_path.iterdir()) == []


def test_keys_left_unset_or_unresolvable_are_named_before_verls_own_checks():
    cfg = verl_config(run_config("data.dir=/cluster/toucan"))
    with open_dict(cfg):
        cfg.data.max_prompt_length = "???"
        cfg.distillation.teacher = "???"  # a section verl does not read with distillation off
    problems = check_verl_config(cfg)
    assert keys(problems) == ["data.max_prompt_length"]
    assert problems[0].what == "has no value (???)"
    assert "engine.verl.max_prompt_length" in problems[0].fix  # the key of ours
    cfg = verl_config(run_config("data.dir=/cluster/toucan"))
    cfg.trainer.project_name = "${no.such.key}"
    (bad,) = check_verl_config(cfg)
    # a problem, not a traceback: the key whose value (or interpolation of it) fails
    assert bad.key.endswith("project_name") and "no.such.key" in bad.what
