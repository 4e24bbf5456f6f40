"""``engine=verl``: the run config translated into a complete verl 0.9.x PPO trainer config.

    RunConfig (+ Recipe)
      -> verl's own ``ppo_trainer`` composed with Hydra from verl's packaged config folder
         (once per process, then copied; ``compose.py``)
      -> our values, one verl key each (:func:`verl_values`; :data:`SOURCES` names the key of
         ours each one comes from)
      -> ``engine.verl.overrides``, applied last with Hydra's override syntax (``overrides.py``)
      == verl_config(config, recipe)                      (DictConfig, interpolations kept)
      -> check_verl_config(cfg): verl's own checks on CPU  (``checks.py``; list[Problem])

The estimator is ``algorithm.adv_estimator = algorithm.name`` (``grpo`` is verl's own;
``slca_grpo`` and ``toolpo_grpo`` are registered by :mod:`slca_exp.engines.verl.plugin`, which
every Ray worker imports through ``VERL_USE_EXTERNAL_MODULES`` in
``ray_kwargs.ray_init.runtime_env.env_vars``). Our estimator hyper-parameters travel under
``algorithm.slca``: verl 0.9.1 hands the ``algorithm`` DictConfig to the estimator as it is and
never converts it to its ``AlgoConfig`` dataclass, so the extra mapping is safe. The agent loop
follows the estimator (:func:`agent_loop`): ours for ours (R_tool and R_sum at their segments'
ends), verl's own for ``grpo`` (the reward side's weighted total on the last token).

Composing needs only verl's YAML files (verl is found, not imported); checking imports verl.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from slca_exp.config.schema import RunConfig
from slca_exp.core.problems import Problem
from slca_exp.engines.verl import cpu
from slca_exp.engines.verl.keys import (
    ACTOR,
    AGENT_LOOPS_FILE,
    BATCHES_DIR,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    DATA_DIR,
    ENV_VARS_KEY,
    GRAD_COS_KEY,
    OUR_KEY,
    PARAMS_KEY,
    REF,
    ROLLOUT,
    TOOLS_FILE,
    TURNS,
    VERL_AGENT_LOOP,
)
from slca_exp.engines.verl.problems import keyed_problem
from slca_exp.engines.verl.translation import (
    backend_of,
    chat_template,
    model_path,
    run_name_of,
    translated,
    verl_dir,
    worker_env,
)
from slca_exp.recipe import Recipe

FIELD_KEYS: dict[str, tuple[str, ...]] = {
    "nnodes": ("trainer.nnodes",),
    "n_gpus_per_node": ("trainer.n_gpus_per_node",),
    "strategy": (ACTOR + "strategy",),
    "train_batch_size": ("data.train_batch_size",),
    "ppo_mini_batch_size": (ACTOR + "ppo_mini_batch_size",),
    "ppo_micro_batch_size_per_gpu": (ACTOR + "ppo_micro_batch_size_per_gpu",),
    "log_prob_micro_batch_size_per_gpu": (
        ROLLOUT + "log_prob_micro_batch_size_per_gpu",
        REF + "log_prob_micro_batch_size_per_gpu",
    ),
    "max_prompt_length": ("data.max_prompt_length",),
    "max_response_length": ("data.max_response_length",),
    "filter_overlong_prompts": ("data.filter_overlong_prompts",),
    "tensor_model_parallel_size": (ROLLOUT + "tensor_model_parallel_size",),
    "gpu_memory_utilization": (ROLLOUT + "gpu_memory_utilization",),
    "max_model_len": (ROLLOUT + "max_model_len",),
    "max_num_seqs": (ROLLOUT + "max_num_seqs",),
    "prefix_caching": (ROLLOUT + "enable_prefix_caching",),
    "chunked_prefill": (ROLLOUT + "enable_chunked_prefill",),
    "enforce_eager": (ROLLOUT + "enforce_eager",),
    "temperature": (ROLLOUT + "temperature",),
    "max_assistant_turns": (TURNS + "max_assistant_turns",),
    "max_user_turns": (TURNS + "max_user_turns",),
    "max_parallel_calls": (TURNS + "max_parallel_calls",),
    "max_tool_response_length": (TURNS + "max_tool_response_length",),
    "tool_response_truncate_side": (TURNS + "tool_response_truncate_side",),
    "agent_workers": (ROLLOUT + "agent.num_workers",),
    "lr": (ACTOR + "optim.lr",),
    "use_kl_loss": (ACTOR + "use_kl_loss",),
    "kl_loss_coef": (ACTOR + "kl_loss_coef", "algorithm.kl_ctrl.kl_coef"),
    "kl_loss_type": (ACTOR + "kl_loss_type", "algorithm.kl_penalty"),
    "use_kl_in_reward": ("algorithm.use_kl_in_reward",),
    "total_epochs": ("trainer.total_epochs",),
    "total_training_steps": ("trainer.total_training_steps",),
    "save_freq": ("trainer.save_freq",),
    "keep_checkpoints": ("trainer.max_actor_ckpt_to_keep",),
    "test_freq": ("trainer.test_freq",),
    "val_before_train": ("trainer.val_before_train",),
    "val_n": (ROLLOUT + "val_kwargs.n",),
    "val_do_sample": (ROLLOUT + "val_kwargs.do_sample",),
    "val_temperature": (ROLLOUT + "val_kwargs.temperature",),
}
"""``engine.verl.<field>`` -> the verl keys of the RL config it sets (``mask_rule``:
``algorithm.slca``; the ``sft_*`` fields: ``sft_config.FIELD_KEYS``)."""

SOURCES: dict[str, str] = {
    **{key: "engine.verl.backend (cpu)" for key in cpu.KEYS},
    **{key: f"engine.verl.{field}" for field, keys in FIELD_KEYS.items() for key in keys},
    "actor_rollout_ref.model.path": "backbone.path",
    "actor_rollout_ref.model.custom_chat_template": "backbone.chat_template",
    ROLLOUT + "n": "algorithm.group_size",
    ROLLOUT + "seed": "seed",
    ACTOR + "data_loader_seed": "seed",
    "data.train_files": "data.files.train (its copy with tools_kwargs)",
    "data.val_files": "data.files.val (its copy with tools_kwargs)",
    "data.seed": "data.seed",
    "algorithm.adv_estimator": "algorithm.name",
    ROLLOUT + "agent.default_agent_loop": "algorithm.name (the loop its scores need)",
    "algorithm.norm_adv_by_std_in_grpo": "algorithm.norm_by_std",
    PARAMS_KEY: "algorithm.* and engine.verl.mask_rule",
    PARAMS_KEY + ".mask_rule": "engine.verl.mask_rule",
    GRAD_COS_KEY: "engine.rl.grad_cos",
    "trainer.logger": "tracking.backends",
    "trainer.project_name": "tracking.wandb_project, else experiment_name",
    "trainer.experiment_name": "run_name",
}
"""verl key -> the key of ours it is translated from (a problem's fix names it)."""

FIXED: dict[str, Any] = {
    ROLLOUT + "name": "vllm",
    TURNS + "enable": True,
    TURNS + "format": "hermes",
    # HierR + the judge, per trajectory (slca_exp/engines/verl/rewards.py)
    "reward.reward_manager.source": "importlib",
    "reward.reward_manager.name": "SLCARewardManager",
    "reward.reward_manager.module.path": "pkg://slca_exp.engines.verl.rewards",
    "critic.enable": False,  # GRPO-family estimators: no value model
    # verl's synchronous trainer plus our per-segment metrics and the corrected mask rule
    # (slca_exp/engines/verl/trainer.py, registered by the plugin)
    "trainer.v1.trainer_mode": "slca_sync",
    # replaced by slca-exp's rollout logging (tracking.rollouts; engines/verl/rollouts.py)
    "trainer.log_val_generations": 0,
}
"""verl values every translated config has."""

ALSO = {
    "data.train_batch_size": "algorithm.group_size, engine.verl.nnodes and n_gpus_per_node",
    ROLLOUT + "tensor_model_parallel_size": "engine.verl.nnodes and n_gpus_per_node",
    ACTOR + "ppo_mini_batch_size": "algorithm.group_size, engine.verl.nnodes and n_gpus_per_node",
}
"""Keys of ours that take part in the check of a verl key besides its own source."""


def verl_config(config: RunConfig, recipe: Recipe | None = None) -> DictConfig:
    """The complete verl PPO trainer config of a run.

    Args:
        config: the validated run config (``engine.verl`` holds the verl settings).
        recipe: its recipe, when built: the data files it checked and the trackers' run name.

    Returns:
        verl's composed ``ppo_trainer`` with our values, then ``engine.verl.overrides``; verl's
        own interpolations are kept (its TaskRunner resolves them).

    Raises:
        ConfigError: verl is not installed, the backbone cannot run on verl, or an override is
            bad (each problem names its key).

    """
    return translated(
        config,
        Path(CONFIG_FILE).stem,
        verl_values(config, recipe),
        config.engine.verl.overrides,
        "engine.verl.overrides",
        new_keys=(PARAMS_KEY, ENV_VARS_KEY, OUR_KEY, *cpu.NEW_KEYS),
    )


def verl_values(config: RunConfig, recipe: Recipe | None = None) -> dict[str, Any]:
    """Our values by verl key: :data:`FIELD_KEYS`, :data:`SOURCES`, :data:`FIXED` and the rest."""
    v = config.engine.verl
    folder = verl_dir(config)
    train, val = data_files(config, recipe)
    values = {key: getattr(v, field) for field, keys in FIELD_KEYS.items() for key in keys}
    values.update(FIXED)
    values.update(
        {
            "actor_rollout_ref.model.path": model_path(config, recipe),
            "actor_rollout_ref.model.custom_chat_template": chat_template(config),
            ROLLOUT + "n": config.algorithm.group_size,
            ROLLOUT + "seed": config.seed,
            ACTOR + "data_loader_seed": config.seed,
            # Written into the run folder with this config (side_files.py); not read here.
            TURNS + "tool_config_path": str(folder / TOOLS_FILE),
            ROLLOUT + "agent.agent_loop_config_path": str(folder / AGENT_LOOPS_FILE),
            OUR_KEY: {
                **our_section(config),
                "data": {"train": train, "val": val},
                "dump_dir": str(folder / BATCHES_DIR) if v.dump_batches else None,
                "rollouts": rollout_section(config, recipe),
                # the gradient-conflict diagnostic, read by our trainer (grad_cos.py): the one
                # engine.rl key verl reads, so that the switch is the same on both engines
                "grad_cos": config.engine.rl.grad_cos,
            },
            "data.train_files": str(folder / DATA_DIR / "train.parquet") if train else None,
            "data.val_files": str(folder / DATA_DIR / "val.parquet") if val else None,
            "data.seed": config.data.seed,
            "algorithm.adv_estimator": config.algorithm.name,  # grpo: verl's; ours: the plugin
            ROLLOUT + "agent.default_agent_loop": agent_loop(config.algorithm.name),
            "algorithm.norm_adv_by_std_in_grpo": config.algorithm.norm_by_std,
            PARAMS_KEY: {**estimator_params(config), "mask_rule": v.mask_rule},
            "trainer.logger": list(config.tracking.backends),  # verl has the same three names
            # verl's W&B logger opens this project (MLflow attaches to our run by its id)
            "trainer.project_name": config.tracking.wandb_project or config.experiment_name,
            "trainer.experiment_name": run_name_of(config, recipe),
            "trainer.default_local_dir": str(folder / CHECKPOINTS_DIR),
            ENV_VARS_KEY: worker_env(config),
        }
    )
    if backend_of(config) == "cpu":
        uses_ref = v.use_kl_loss or v.use_kl_in_reward
        values.update(cpu.verl_values(uses_ref, v.cpu_rollout))
        values.update(cpu.new_values(uses_ref, v.n_gpus_per_node))
    return values


def agent_loop(estimator: str) -> str:
    """The agent loop verl runs for ``estimator`` (``actor_rollout_ref.rollout.agent``).

    Ours (:data:`slca_exp.engines.verl.agent_loop.AGENT_NAME`, listed in the agent-loop config
    written next to the verl config: ``agent_loops.yaml``) puts R_tool and R_sum at their
    segments' ends, which our estimators read; an estimator of verl's (``grpo``) gets verl's own
    multi-turn loop, ``tool_agent``, which puts the reward side's total (weighted as
    ``reward.*`` says, or the penalty) on the last response token, as verl's estimators expect.
    """
    from slca_exp.engines.verl.agent_loop import AGENT_NAME
    from slca_exp.engines.verl.estimators import NAMES

    return AGENT_NAME if estimator in NAMES else VERL_AGENT_LOOP


def our_section(config: RunConfig) -> dict[str, Any]:
    """What the verl config carries under ``slca_exp`` for the reward workers and tools.

    verl logs its whole config as MLflow params, this section included, so it goes through the
    run's redactor: secrets reach the workers through the environment (``api_key_env``) only.
    """
    from slca_exp.tracking.redact import Redactor

    redactor = Redactor.for_config(config)
    section = {
        name: redactor.mapping(
            OmegaConf.to_container(OmegaConf.structured(getattr(config, name)), resolve=True)
        )
        for name in ("reward", "judge", "simulator")
    }
    noise = section["judge"].get("noise")
    if isinstance(noise, dict) and noise.get("seed") is None:
        noise["seed"] = config.seed  # the reward workers build the judge without the run's seed
    return section


def rollout_section(config: RunConfig, recipe: Recipe | None) -> dict[str, Any]:
    """``slca_exp.rollouts``: which rollouts slca-exp's trainer logs, and what it tags them with.

    ``tracking.rollouts`` plus the run's algorithm, seed and engine and the names the traces
    record (the simulator, and the sources of their feedback), as the local engine records them.
    """
    from slca_exp.tracking.redact import Redactor
    from slca_exp.tracking.rollout_traces import TraceSources

    redact = Redactor.for_config(config).text
    tags = {k: redact(v) for k, v in recipe.tags().items()} if recipe is not None else {}
    sources = TraceSources.from_tags(tags)
    if not sources.simulator:
        sources = dataclasses.replace(sources, simulator=redact(config.simulator.backend))
    return {
        **dataclasses.asdict(config.tracking.rollouts),
        "run": {"algorithm": config.algorithm.name, "seed": config.seed, "engine": "verl"},
        "sources": dataclasses.asdict(sources),
    }


def estimator_params(config: RunConfig) -> dict[str, Any]:
    """Our ``EstimatorParams`` fields from ``algorithm``: what ``algorithm.slca`` holds."""
    from slca_exp.estimators import EstimatorParams

    return {f.name: getattr(config.algorithm, f.name) for f in dataclasses.fields(EstimatorParams)}


def data_files(config: RunConfig, recipe: Recipe | None) -> tuple[str | None, str | None]:
    """Train and val files: the recipe's checked paths, else where the config puts them.

    Without a recipe nothing is read or generated (the Toucan files live on the cluster): the
    data source of ``data.kind`` says where its files are, as it does when the splits are loaded.
    """
    if recipe is not None and recipe.data.get("files"):
        files = recipe.data["files"]
        return (files.get("train") or {}).get("path"), (files.get("val") or {}).get("path")
    from slca_exp.data.sources import data_source

    planned = data_source(config.data.kind).planned(config)
    train, val = (str(planned[name]) if name in planned else None for name in ("train", "val"))
    return train, val


def problem(key: str, what: str, fix: str = "") -> Problem:
    """A problem on verl key ``key`` of the RL config; the fix names our key (``problems.py``)."""
    return keyed_problem(
        key,
        what,
        fix,
        sources=SOURCES,
        fixed=FIXED,
        overrides="engine.verl.overrides",
        also=ALSO,
    )
