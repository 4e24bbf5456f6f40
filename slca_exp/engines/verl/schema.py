"""``engine=verl``'s own settings: the ``engine.verl`` section of its config.

:class:`VerlEngineConfig` is the verl engine's schema (``slca_exp.engines`` registers it, and
``conf/engine/verl.yaml`` merges onto it): every engine setting plus ``engine.verl``. It imports
nothing of verl, so composing and validating a recipe stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from slca_exp.config.fields import param
from slca_exp.config.schema import EngineConfig
from slca_exp.core.problems import Problem

KL_TYPES = ("low_var_kl", "kl", "abs", "mse", "k1", "k2", "k3")
"""KL estimators verl 0.9 accepts (``core_algos.kl_penalty``)."""
TRUNCATE_SIDES = ("middle", "left", "right")
"""Where verl's tool agent loop cuts a tool response that is too long."""
SFT_SCHEDULERS = ("constant", "cosine")
"""Learning-rate schedules of verl's SFT trainer (``FSDPOptimizerConfig.lr_scheduler_type``)."""


@dataclass
class VerlConfig:
    """``engine=verl``: the verl 0.9.x settings we model.

    Each field names the verl key it becomes: those of the RL stage in verl's PPO trainer config
    (``slca_exp/engines/verl/rl_config.py``), the ``sft_*`` ones in its SFT trainer config
    (``slca_exp/engines/verl/sft_config.py``, with ``engine.sft.*``); anything else goes through
    ``overrides`` and ``sft_overrides``. The group size is ``algorithm.group_size`` (verl's
    ``rollout.n``), the estimator ``algorithm.name``. A default is verl's own unless slca-exp
    picks another (batch sizes, lengths, turns, KL, length of the run, checkpoints);
    ``experiment=paper_7b`` sets the public SLCA-GRPO launcher's values.
    """

    backend: str = param(
        "cuda",
        "where verl trains: cuda (GPUs, vLLM rollout) | cpu (no accelerator: vLLM's CPU build, "
        "gloo, FSDP2; slca_exp/engines/verl/cpu) | auto (cuda when this host has a GPU)",
        choices=("cuda", "cpu", "auto"),
    )
    cpu_rollout: str = param(
        "vllm",
        "the cpu backend's rollout: vllm (verl's vLLM rollout, agent loop and weight sync on "
        "vLLM's CPU build, as a GPU run generates; minutes to start) | hf (a transformers "
        "server: seconds to start, for runs that test what happens around generation)",
        choices=("vllm", "hf"),
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
    filter_overlong_prompts: bool = param(
        False,
        "drop the rows whose prompt is longer than max_prompt_length when verl loads a split "
        "(data.filter_overlong_prompts); false: verl's agent loop keeps the prompt's last "
        "max_prompt_length tokens",
    )
    tensor_model_parallel_size: int = param(
        2, "vLLM tensor parallel size (rollout.tensor_model_parallel_size)", gt=0
    )
    gpu_memory_utilization: float = param(
        0.6, "share of GPU memory vLLM may take (rollout.gpu_memory_utilization)", gt=0, le=1
    )
    max_model_len: int | None = param(
        None,
        "vLLM context length: prompt plus response, tool responses included "
        "(rollout.max_model_len); null: the backbone's max_position_embeddings",
        gt=0,
    )
    max_num_seqs: int = param(
        256, "sequences one vLLM replica decodes at once (rollout.max_num_seqs)", gt=0
    )
    prefix_caching: bool = param(
        True, "vLLM reuses the KV cache of shared prefixes (rollout.enable_prefix_caching)"
    )
    chunked_prefill: bool = param(
        True, "vLLM splits long prefills into chunks (rollout.enable_chunked_prefill)"
    )
    enforce_eager: bool = param(
        False, "vLLM runs eagerly, no CUDA graphs captured (rollout.enforce_eager)"
    )
    temperature: float = param(1.0, "rollout sampling temperature (rollout.temperature)", gt=0)
    max_assistant_turns: int = param(
        10, "assistant turns per rollout (rollout.multi_turn.max_assistant_turns)", gt=0
    )
    max_user_turns: int | None = param(
        None,
        "rounds of tool responses per rollout; the rollout ends at the assistant turn after the "
        "last one (rollout.multi_turn.max_user_turns); null: no limit",
        gt=0,
    )
    max_parallel_calls: int = param(
        20, "tool calls executed per assistant turn (rollout.multi_turn.max_parallel_calls)", gt=0
    )
    max_tool_response_length: int = param(
        256,
        "characters of one tool response kept, longer ones are cut "
        "(rollout.multi_turn.max_tool_response_length)",
        gt=0,
    )
    tool_response_truncate_side: str = param(
        "middle",
        "what a cut tool response loses: middle (keeps both ends) | left (keeps the end) | "
        "right (keeps the start); rollout.multi_turn.tool_response_truncate_side",
        choices=TRUNCATE_SIDES,
    )
    agent_workers: int = param(
        8,
        "agent-loop workers that run the rollouts (rollout.agent.num_workers; the cpu backend "
        "runs 1)",
        gt=0,
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
    keep_checkpoints: int | None = param(
        None,
        "actor checkpoints kept, the oldest deleted first (trainer.max_actor_ckpt_to_keep); "
        "null: all",
        gt=0,
    )
    test_freq: int = param(10, "validate every N steps, -1: never (trainer.test_freq)", ge=-1)
    val_before_train: bool = param(
        True, "validate once before the first step (trainer.val_before_train)"
    )
    val_n: int = param(1, "samples per validation prompt (rollout.val_kwargs.n)", gt=0)
    val_do_sample: bool = param(
        False, "sample validation responses; false: greedy (rollout.val_kwargs.do_sample)"
    )
    val_temperature: float = param(
        0.0,
        "validation sampling temperature, 0: greedy (rollout.val_kwargs.temperature; verl's "
        "agent loop samples validation with it)",
        ge=0,
        finite=True,
    )
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
    sft_epochs: int | None = param(
        None,
        "SFT stage: passes over the SFT split (trainer.total_epochs), epochs x (split rows // "
        "engine.sft.batch_size) steps, with engine.sft.steps=0; null: engine.sft.steps steps",
        gt=0,
    )
    sft_lr_scheduler: str = param(
        "constant",
        "SFT stage: learning-rate schedule after the warm-up, constant | cosine (to 0 at the "
        "last step); optim.lr_scheduler_type",
        choices=SFT_SCHEDULERS,
    )
    sft_warmup_ratio: float = param(
        0.0,
        "SFT stage: share of its steps with a linear warm-up from 0 (optim.lr_warmup_steps_ratio)",
        ge=0,
        le=1,
    )
    sft_micro_batch_size_per_gpu: int | None = param(
        None,
        "SFT stage: trajectories per forward/backward pass on one GPU, the rest of "
        "engine.sft.batch_size accumulated (data.micro_batch_size_per_gpu, data.use_dynamic_bsz "
        "off); null: verl's dynamic batches of data.max_token_len_per_gpu tokens",
        gt=0,
    )
    sft_weight_decay: float = param(
        0.01, "SFT stage: AdamW weight decay (optim.weight_decay)", ge=0, finite=True
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

    @classmethod
    def problems(cls, cfg: DictConfig) -> list[Problem]:
        """The SFT stage's length is set once: by ``engine.sft.steps`` or by ``sft_epochs``."""
        engine = cfg.engine
        epochs, steps = engine.verl.sft_epochs, engine.sft.steps
        if not engine.sft.enabled or epochs is None or steps == 0:
            return []
        return [
            Problem(
                "engine.sft.steps",
                f"engine.sft.steps={steps} and engine.verl.sft_epochs={epochs} both set the "
                "length of the SFT stage",
                f"set engine.sft.steps=0 to train {epochs} epochs, or engine.verl.sft_epochs=null "
                f"to train {steps} steps",
            )
        ]
