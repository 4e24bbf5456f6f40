"""verl's own checks of the translated configs, RL and SFT, run on CPU before anything launches.

    verl_config(config)  -> check_verl_config(cfg)   what ``verl.trainer.main_ppo`` checks
    sft_config(config)   -> check_sft_config(cfg)    what ``verl.trainer.sft_trainer_ray`` checks
                         == list[Problem]            every problem found; [] when valid

Each runs what verl checks before it trains (``validate_config`` and the dataclass conversions
its workers make, the registries it looks names up in, the classes it loads) and what its
workers assert only once on GPUs (the vLLM replica layout, batch splits over the data-parallel
ranks). Every problem names verl's key and, through the translation's table (``SOURCES`` of
``rl_config.py`` or ``sft_config.py``), the key of ours it comes from.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
import re
import warnings
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from slca_exp.core.problems import Problem
from slca_exp.engines.verl.keys import (
    ACTOR,
    ENV_VARS_KEY,
    MODULES_ENV,
    PARAMS_KEY,
    REF,
    ROLLOUT,
    TURNS,
)
from slca_exp.engines.verl.problems import first_line, unresolved
from slca_exp.engines.verl.rl_config import problem
from slca_exp.engines.verl.sft_config import sft_problem


def check_verl_config(cfg: DictConfig) -> list[Problem]:
    """Run verl's own checks of a translated config on CPU; every problem found.

    What ``verl.trainer.main_ppo`` checks before Ray starts (``validate_config``, which stops at
    its first failure), the dataclass conversions its workers do (rollout with its multi-turn,
    agent-loop and checkpoint-engine parts; critic and distillation when used), the registries
    it looks names up in (the advantage estimator after importing the modules its workers
    import, tool parser, agent loop, reward manager, trainer mode, loggers), and the
    divisibility its workers assert once on GPUs. Not checked here: the model files
    (``HFModelConfig`` reads them) and the tool config file (written at launch).

    Args:
        cfg: a config from ``verl_config`` (``rl_config.py``; left unchanged).

    Returns:
        Problems keyed by the verl key; each fix names the key of ours it comes from.

    """
    cfg = copy.deepcopy(cfg)
    unused = tuple(  # sections verl never reads with these settings (they keep their ???)
        f"{section}."
        for section, on in (("reward.reward_model", "enable"), ("distillation", "enabled"))
        if not OmegaConf.select(cfg, f"{section}.{on}", default=False)
    )
    problems = unresolved(cfg, problem, unused)
    if problems:
        return problems
    with warnings.catch_warnings():  # verl warns about optional engines it cannot import
        warnings.simplefilter("ignore")
        return _rl_checks(cfg)


def _rl_checks(cfg: DictConfig) -> list[Problem]:
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.tracking import Tracking

    problems = _import_worker_modules(cfg)
    use_ref, use_critic = need_reference_policy(cfg), need_critic(cfg)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # it prints its notices and a success line
            validate_config(cfg, use_reference_policy=use_ref, use_critic=use_critic)
    except Exception as err:  # noqa: BLE001 - any failure of verl's check is a problem
        problems.append(_from_verl(err))
    converted = ["actor_rollout_ref.rollout"] + (["critic"] if use_critic else [])
    if cfg.distillation.get("enabled"):
        converted.append("distillation")
    for section in converted:  # as verl's workers convert them (the actor: in validate_config)
        try:
            omega_conf_to_dataclass(OmegaConf.select(cfg, section))
        except Exception as err:  # noqa: BLE001
            problems.append(_from_verl(err, section))
    rollout = cfg.actor_rollout_ref.rollout
    estimators = {
        *core_algos.ADV_ESTIMATOR_REGISTRY,
        *(e.value for e in core_algos.AdvantageEstimator),
    }
    loop, loggers = rollout.agent.default_agent_loop, cfg.trainer.logger or []
    loops = {*_agent_loop_registry}
    if rollout.agent.get("agent_loop_config_path"):  # our loop, listed in the file written
        from slca_exp.engines.verl.agent_loop import AGENT_NAME, SLCAToolAgentLoop  # noqa: F401

        loops.add(AGENT_NAME)
    named = [
        ("algorithm.adv_estimator", cfg.algorithm.adv_estimator, estimators),
        (TURNS + "format", rollout.multi_turn.format, ToolParser._registry),
        (ROLLOUT + "agent.default_agent_loop", loop, loops),
        *((f"trainer.logger[{i}]", n, Tracking.supported_backend) for i, n in enumerate(loggers)),
    ]
    manager = cfg.reward.reward_manager
    if manager.source == "register":
        named.append(("reward.reward_manager.name", manager.name, REWARD_MANAGER))
    else:  # importlib: load the class as verl's reward workers will
        from verl.trainer.ppo.reward import resolve_reward_manager_cls

        try:
            resolve_reward_manager_cls(cfg)
        except Exception as err:  # noqa: BLE001 - any failure to load it is a problem
            problems.append(_from_verl(err, "reward.reward_manager"))
    for key, name, known in named:
        if name not in known:
            problems.append(problem(key, f"verl knows no {name!r}", f"one of {', '.join(known)}"))
    adapter = importlib.import_module("slca_exp.engines.verl.estimators")
    rules = tuple(getattr(adapter, "MASK_RULES", ("parity",)))  # what the adapter implements
    rule = OmegaConf.select(cfg, PARAMS_KEY + ".mask_rule", default="parity")
    if rule not in rules:  # never let a setting be ignored silently
        problems.append(
            problem(
                PARAMS_KEY + ".mask_rule",
                f"mask rule {rule!r}: the verl estimator adapter implements {', '.join(rules)}",
                f"use {rules[0]}",
            )
        )
    try:
        trainer = get_trainer_cls(cfg.trainer.v1.trainer_mode)
    except ValueError as err:
        problems.append(problem("trainer.v1.trainer_mode", first_line(err)))
    else:
        from slca_exp.engines.verl.trainer import TRAINER_MODE, SLCATrainer

        if rule == "corrected" and not issubclass(trainer, SLCATrainer):
            problems.append(
                problem(
                    "trainer.v1.trainer_mode",
                    f"mask_rule=corrected needs slca-exp's trainer ({TRAINER_MODE}), which tells "
                    f"the estimator which rollouts ended on a tool call; "
                    f"{cfg.trainer.v1.trainer_mode!r} does not",
                    "remove the trainer.v1.trainer_mode override, or use "
                    "engine.verl.mask_rule=parity",
                )
            )
    return problems + _rl_gpu_checks(cfg)


def _import_worker_modules(cfg: DictConfig) -> list[Problem]:
    """Import what ``VERL_USE_EXTERNAL_MODULES`` names, as every verl worker will."""
    env = OmegaConf.select(cfg, ENV_VARS_KEY, default=None) or {}
    problems = []
    for module in filter(None, (m.strip() for m in str(env.get(MODULES_ENV, "")).split(","))):
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - the worker's failure, reported here
            problems.append(
                problem(
                    f"{ENV_VARS_KEY}.{MODULES_ENV}",
                    f"verl's workers would fail to import {module!r}: {type(err).__name__}: {err}",
                    "install the module where verl runs, or remove it from the list",
                )
            )
    return problems


def _rl_gpu_checks(cfg: DictConfig) -> list[Problem]:
    """What verl's workers assert once on GPUs (``verl/workers/engine_workers.py``)."""
    rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    n_gpus = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    replica = (
        rollout.tensor_model_parallel_size
        * rollout.data_parallel_size
        * rollout.pipeline_model_parallel_size
    )
    problems = []
    if n_gpus % replica:
        problems.append(
            problem(
                ROLLOUT + "tensor_model_parallel_size",
                f"a vLLM replica spans {replica} GPUs (tensor x data x pipeline parallel), which "
                f"does not divide the {n_gpus} GPUs (nnodes x n_gpus_per_node)",
                "pick a tensor parallel size that divides the GPUs per node",
            )
        )
    dp = n_gpus // max(1, int(actor.get("ulysses_sequence_parallel_size") or 1))
    mini = actor.ppo_mini_batch_size * rollout.n
    if not actor.use_dynamic_bsz and dp and mini % dp:
        problems.append(
            problem(
                ACTOR + "ppo_mini_batch_size",
                f"a mini-batch of {actor.ppo_mini_batch_size} prompts x n={rollout.n} = {mini} "
                f"rollouts does not split over {dp} data-parallel ranks",
                f"make ppo_mini_batch_size x group size a multiple of {dp}",
            )
        )
    return problems


_MESSAGES = [
    (r"real_train_batch_size", "data.train_batch_size"),
    (r"train_batch_size \(\d+\) must be >=", ACTOR + "ppo_mini_batch_size"),
    (r"ppo_micro_batch_size", ACTOR + "ppo_micro_batch_size_per_gpu"),
    (r"\[actor_rollout_ref\.ref\]", REF + "log_prob_micro_batch_size_per_gpu"),
    (r"\[actor_rollout_ref\.rollout\]", ROLLOUT + "log_prob_micro_batch_size_per_gpu"),
    (r"validation gen temperature", ROLLOUT + "temperature"),
    (r"expert_parallel_size", ROLLOUT + "expert_parallel_size"),
    (r"pipeline_model_parallel_size", ROLLOUT + "pipeline_model_parallel_size"),
    (r"loss_agg_mode", ACTOR + "loss_agg_mode"),
]
"""verl's check messages -> the verl key they are about (where the message does not say)."""
_KEY_IN_TEXT = re.compile(
    r"\b((?:actor_rollout_ref|data|trainer|algorithm|critic|reward)(?:\.\w+)+)"
)


def _from_verl(err: BaseException, section: str = "") -> Problem:
    """A problem from an exception of verl's checks, keyed by the verl key it concerns."""
    text = _text(err)
    key = next((k for pattern, k in _MESSAGES if re.search(pattern, text)), None)
    if key is None and (found := _KEY_IN_TEXT.search(text)):
        key = found.group(1)
    if key is None and getattr(err, "full_key", None):
        key = f"{section}.{err.full_key}" if section else str(err.full_key)
    return problem(key or section or "<verl config>", f"verl: {text}")


def _text(err: BaseException) -> str:
    """An error's message on one line (its type's name when there is none)."""
    return " ".join(str(err).split()) or type(err).__name__


# -- the SFT trainer's ----------------------------------------------------------------------


def check_sft_config(cfg: DictConfig) -> list[Problem]:
    """Run what verl's SFT trainer checks before it trains, on CPU; every problem found.

    The dataclass conversions of ``SFTTrainer._build_config`` (engine, optim, checkpoint,
    profiler) and its profile-interval check, the engine registry it builds the engine from,
    the dataset class ``data.custom_cls`` names, the loggers ``Tracking`` knows, and what fails
    once on GPUs: a global batch that does not split over the data-parallel ranks (verl's
    balanced partitions and dispatch), sequences longer than dynamic batching takes, no step
    to train, a converted split smaller than one batch. Not checked here: the model files
    (``HFModelConfig`` reads them) and the rows' tokens.

    Args:
        cfg: a config from ``sft_config`` (left unchanged).

    Returns:
        Problems keyed by the verl key; each fix names the key of ours it comes from.

    """
    cfg = copy.deepcopy(cfg)
    problems = unresolved(cfg, sft_problem)
    if problems:
        return problems
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # verl warns about optional engines it cannot import
        return _sft_checks(cfg) + _sft_gpu_checks(cfg)


def _sft_checks(cfg: DictConfig) -> list[Problem]:
    from types import SimpleNamespace

    from verl.trainer.sft_trainer_ray import SFTTrainer
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.import_utils import load_extern_object
    from verl.utils.tracking import Tracking
    from verl.workers.engine import EngineRegistry

    problems = []
    for section in ("engine", "optim", "checkpoint", "profiler"):  # as SFTTrainer._build_config
        try:
            omega_conf_to_dataclass(cfg[section])
        except Exception as err:  # noqa: BLE001 - any failure of verl's conversion is a problem
            key = f"{section}.{err.full_key}" if getattr(err, "full_key", None) else section
            problems.append(sft_problem(key, f"verl: {_verl_error(err)}"))
    interval = SimpleNamespace(profiler_interval=list(cfg.trainer.profile_interval))
    try:
        SFTTrainer._validate_profiler_interval(interval)
    except (AssertionError, TypeError) as err:
        problems.append(sft_problem("trainer.profile_interval", f"verl refuses it {err}".strip()))
    engines = EngineRegistry._engines.get("language_model", {})
    if cfg.engine.strategy not in engines:
        problems.append(
            sft_problem(
                "engine.strategy",
                f"verl has no {cfg.engine.strategy!r} engine here",
                f"one of {', '.join(engines)}",
            )
        )
    custom = cfg.data.custom_cls
    if custom.get("path"):
        try:
            load_extern_object(custom.path, custom.name)
        except Exception as err:  # noqa: BLE001 - the trainer's failure, reported here
            problems.append(sft_problem("data.custom_cls", f"verl cannot load it: {err}"))
    for i, name in enumerate(cfg.trainer.logger or []):
        if name not in Tracking.supported_backend:
            known = ", ".join(Tracking.supported_backend)
            problems.append(sft_problem(f"trainer.logger[{i}]", f"verl knows no {name!r}", known))
    return problems


def _verl_error(err: BaseException) -> str:
    """The message of an error of verl's; for a bare ``assert``, the line that failed."""
    text = _text(err)
    cause = err.__cause__ or err
    if isinstance(cause, AssertionError) and not str(cause) and cause.__traceback__:
        import traceback

        text += f" ({traceback.extract_tb(cause.__traceback__)[-1].line})"
    return text


def _sft_gpu_checks(cfg: DictConfig) -> list[Problem]:
    """What fails only once the trainer runs on GPUs (``sft_trainer_ray``, ``engine/utils``)."""
    data, trainer = cfg.data, cfg.trainer
    gpus = trainer.nnodes * trainer.n_gpus_per_node
    sp = int(cfg.engine.get("ulysses_sequence_parallel_size") or 1)
    problems = []
    if gpus % sp:
        problems.append(
            sft_problem(
                "engine.ulysses_sequence_parallel_size",
                f"a sequence-parallel group of {sp} GPUs does not divide the {gpus} GPUs",
                "pick a size that divides the GPUs per node",
            )
        )
    dp = max(1, gpus // sp)
    if data.train_batch_size % dp:
        problems.append(
            sft_problem(
                "data.train_batch_size",
                f"a global batch of {data.train_batch_size} trajectories does not split over "
                f"{dp} data-parallel ranks (nnodes x n_gpus_per_node / sequence parallel)",
                f"make it a multiple of {dp} (with engine.verl.nnodes and n_gpus_per_node)",
            )
        )
    if data.use_dynamic_bsz and data.max_token_len_per_gpu * sp < data.max_length:
        problems.append(
            sft_problem(
                "data.max_token_len_per_gpu",
                f"dynamic batching packs at most {data.max_token_len_per_gpu * sp} tokens per GPU, "
                f"below data.max_length={data.max_length}",
                f"raise it to at least {data.max_length}, or give fixed micro-batches "
                "(engine.verl.sft_micro_batch_size_per_gpu)",
            )
        )
    steps = trainer.total_training_steps  # null: verl counts the steps of total_epochs itself
    if (trainer.total_epochs if steps is None else steps) < 1:
        problems.append(
            sft_problem(
                "trainer.total_training_steps",
                "verl's SFT trainer needs at least one step (it saves at the last one)",
                "set engine.sft.steps >= 1 (with engine.verl.sft_epochs: an SFT split of at least "
                "one batch), or engine.sft.enabled=false",
            )
        )
    train = Path(str(data.train_files))
    if train.is_file():  # written at launch; checked when it is here
        import pyarrow.parquet as pq

        rows = pq.ParquetFile(train).metadata.num_rows
        if rows < data.train_batch_size:
            problems.append(
                sft_problem(
                    "data.train_batch_size",
                    f"{train} holds {rows} trajectories, fewer than one batch (verl drops the "
                    "last incomplete batch, so an epoch would have no step)",
                    f"use at most {rows}",
                )
            )
    return problems
