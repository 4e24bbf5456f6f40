"""``engine=verl``'s own settings: the ``engine.verl`` section of its config.

:class:`VerlEngineConfig` is the verl engine's schema (``slca_exp.engines`` registers it, and
``conf/engine/verl.yaml`` merges onto it): every engine setting plus ``engine.verl``. It imports
nothing of verl, so composing and validating a recipe stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

from slca_exp.config.fields import param
from slca_exp.config.schema import EngineConfig

KL_TYPES = ("low_var_kl", "kl", "abs", "mse", "k1", "k2", "k3")
"""KL estimators verl 0.9 accepts (``core_algos.kl_penalty``)."""


@dataclass
class VerlConfig:
    """``engine=verl``: the verl 0.9.x settings we model (``slca_exp/engines/verl/rl_config.py``).

    Each field names the verl key it becomes; anything else goes through ``overrides``. The
    group size is ``algorithm.group_size`` (verl's ``rollout.n``), the estimator
    ``algorithm.name``.
    """

    backend: str = param(
        "cuda",
        "where verl trains: cuda (GPUs, vLLM rollout) | cpu (no accelerator: transformers "
        "rollout, gloo, FSDP2; slca_exp/engines/verl/cpu) | auto (cuda when this host has a GPU)",
        choices=("cuda", "cpu", "auto"),
    )
    nnodes: int = param(1, "nodes of the Ray cluster (trainer.nnodes)", gt=0)
    n_gpus_per_node: int = param(
        8, "GPUs per node (trainer.n_gpus_per_node); on the cpu backend, trainer processes", gt=0
    )
    strategy: str = param(
        "fsdp", "actor and reference training strategy (actor.strategy)", choices=("fsdp", "fsdp2")
    )
    train_batch_size: int = param(
        128, "prompts per step (data.train_batch_size); each is rolled out group_size times", gt=0
    )
    ppo_mini_batch_size: int = param(
        32, "prompts per actor update (actor.ppo_mini_batch_size; verl multiplies by n)", gt=0
    )
    ppo_micro_batch_size_per_gpu: int = param(
        4,
        "rollouts per forward/backward pass on one GPU (actor.ppo_micro_batch_size_per_gpu)",
        gt=0,
    )
    log_prob_micro_batch_size_per_gpu: int = param(
        8,
        "rollouts per log-prob pass on one GPU (rollout and ref log_prob_micro_batch_size_per_gpu)",
        gt=0,
    )
    max_prompt_length: int = param(4096, "prompt tokens (data.max_prompt_length)", gt=0)
    max_response_length: int = param(
        4096, "response tokens, tool responses included (data.max_response_length)", gt=0
    )
    tensor_model_parallel_size: int = param(
        2, "vLLM tensor parallel size (rollout.tensor_model_parallel_size)", gt=0
    )
    gpu_memory_utilization: float = param(
        0.6, "share of GPU memory vLLM may take (rollout.gpu_memory_utilization)", gt=0, le=1
    )
    temperature: float = param(1.0, "rollout sampling temperature (rollout.temperature)", gt=0)
    max_assistant_turns: int = param(
        10, "assistant turns per rollout (rollout.multi_turn.max_assistant_turns)", gt=0
    )
    max_parallel_calls: int = param(
        20, "tool calls executed per assistant turn (rollout.multi_turn.max_parallel_calls)", gt=0
    )
    lr: float = param(1e-6, "actor learning rate (actor.optim.lr)", gt=0, finite=True)
    use_kl_loss: bool = param(True, "KL to the reference as a loss term (actor.use_kl_loss)")
    kl_loss_coef: float = param(
        0.001, "KL weight (actor.kl_loss_coef; algorithm.kl_ctrl.kl_coef)", ge=0, finite=True
    )
    kl_loss_type: str = param(
        "low_var_kl", "KL estimator (actor.kl_loss_type; algorithm.kl_penalty)", choices=KL_TYPES
    )
    use_kl_in_reward: bool = param(
        False, "KL in the reward instead, folded per segment (algorithm.use_kl_in_reward)"
    )
    total_epochs: int = param(1, "passes over the train split (trainer.total_epochs)", gt=0)
    total_training_steps: int | None = param(
        None, "stop after this many steps (trainer.total_training_steps); null: epochs decide", gt=0
    )
    save_freq: int = param(20, "checkpoint every N steps, -1: never (trainer.save_freq)", ge=-1)
    test_freq: int = param(10, "validate every N steps, -1: never (trainer.test_freq)", ge=-1)
    mask_rule: str = param(
        "parity",
        "segment boundary: parity (the paper: the last learnable run is the summary) | corrected "
        "(a last run cut off inside a tool call is tool); algorithm.slca.mask_rule",
        choices=("parity", "corrected"),
    )
    dump_batches: bool = param(
        False,
        "write each RL step's batch as the actor receives it (advantages, response mask, "
        "scores, old log-probs, token ids, the reward side's per-rollout facts) to "
        "<run folder>/verl/batches/step_<n>.pt",
    )
    overrides: list[str] = param(
        default_factory=list,
        help="raw verl overrides applied last (key=value, +key=value, ++key=value, ~key), e.g. "
        "actor_rollout_ref.actor.entropy_coeff=0.001",
    )
    sft_overrides: list[str] = param(
        default_factory=list,
        help="raw verl overrides of the SFT stage's config (verl's sft_trainer_engine; "
        "slca_exp/engines/verl/sft_config.py), applied last, same syntax as overrides, e.g. "
        "optim.weight_decay=0.0",
    )


@dataclass
class VerlEngineConfig(EngineConfig):
    """``engine=verl``: the settings every engine reads, and verl's own (``engine.verl``)."""

    verl: VerlConfig = param(default_factory=VerlConfig, help="verl settings")
