"""verl's own checks of a translated PPO config, run on CPU before anything launches.

``check_verl_config(cfg)`` runs what verl checks before it trains (``validate_config``, the
dataclass conversions its workers make, the registries it looks names up in, the reward
manager it loads, the trainer class) and what its workers assert only once on GPUs (the vLLM
replica layout, mini-batch splits). Every problem names verl's key and, through
:data:`slca_exp.engines.verl.config.SOURCES`, the key of ours it comes from.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
import re
import warnings

from omegaconf import DictConfig, OmegaConf

from slca_exp.config.validate import Problem
from slca_exp.engines.verl.config import (
    _ACTOR,
    _REF,
    _ROLLOUT,
    _TURNS,
    ENV_VARS_KEY,
    MODULES_ENV,
    PARAMS_KEY,
    first_line,
    problem,
    unresolved,
)


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
        cfg: a config from :func:`verl_config` (left unchanged).

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
        return _verl_checks(cfg)


def _verl_checks(cfg: DictConfig) -> list[Problem]:
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
        from slca_exp.engines.verl.rewards import AGENT_NAME, SLCAToolAgentLoop  # noqa: F401

        loops.add(AGENT_NAME)
    named = [
        ("algorithm.adv_estimator", cfg.algorithm.adv_estimator, estimators),
        (_TURNS + "format", rollout.multi_turn.format, ToolParser._registry),
        (_ROLLOUT + "agent.default_agent_loop", loop, loops),
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
    return problems + _gpu_checks(cfg)


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


def _gpu_checks(cfg: DictConfig) -> list[Problem]:
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
                _ROLLOUT + "tensor_model_parallel_size",
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
                _ACTOR + "ppo_mini_batch_size",
                f"a mini-batch of {actor.ppo_mini_batch_size} prompts x n={rollout.n} = {mini} "
                f"rollouts does not split over {dp} data-parallel ranks",
                f"make ppo_mini_batch_size x group size a multiple of {dp}",
            )
        )
    return problems


_MESSAGES = [
    (r"real_train_batch_size", "data.train_batch_size"),
    (r"train_batch_size \(\d+\) must be >=", _ACTOR + "ppo_mini_batch_size"),
    (r"ppo_micro_batch_size", _ACTOR + "ppo_micro_batch_size_per_gpu"),
    (r"\[actor_rollout_ref\.ref\]", _REF + "log_prob_micro_batch_size_per_gpu"),
    (r"\[actor_rollout_ref\.rollout\]", _ROLLOUT + "log_prob_micro_batch_size_per_gpu"),
    (r"validation gen temperature", _ROLLOUT + "temperature"),
    (r"expert_parallel_size", _ROLLOUT + "expert_parallel_size"),
    (r"pipeline_model_parallel_size", _ROLLOUT + "pipeline_model_parallel_size"),
    (r"loss_agg_mode", _ACTOR + "loss_agg_mode"),
]
"""verl's check messages -> the verl key they are about (where the message does not say)."""
_KEY_IN_TEXT = re.compile(
    r"\b((?:actor_rollout_ref|data|trainer|algorithm|critic|reward)(?:\.\w+)+)"
)


def _from_verl(err: BaseException, section: str = "") -> Problem:
    """A problem from an exception of verl's checks, keyed by the verl key it concerns."""
    text = " ".join(str(err).split()) or type(err).__name__
    key = next((k for pattern, k in _MESSAGES if re.search(pattern, text)), None)
    if key is None and (found := _KEY_IN_TEXT.search(text)):
        key = found.group(1)
    if key is None and getattr(err, "full_key", None):
        key = f"{section}.{err.full_key}" if section else str(err.full_key)
    return problem(key or section or "<verl config>", f"verl: {text}")
