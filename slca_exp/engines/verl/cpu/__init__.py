"""``engine.verl.backend=cpu``: verl 0.9.x's own trainers on CPU, no accelerator needed.

Everything verl needs to train on a CPU host lives in this package, and verl is extended only
from outside: nothing of verl's is copied, patched or replaced at run time.

    platform.py   the ``cpu`` platform in verl's ``PlatformRegistry`` (``VERL_PLATFORM=cpu``):
                  device ``cpu``, gloo, a logical GPU slot per worker in Ray; imported first in
                  every verl process (``VERL_USE_EXTERNAL_MODULES``), before any module asks
                  verl for its platform
    rollout.py    the rollout backend ``hf`` (``actor_rollout_ref.rollout.name=hf``): one Ray
                  actor per replica generating with transformers, token ids in, token ids and
                  log-probs out, the trainer's weights pushed to it after every update
    internals.py  the verl internals this backend leans on, each with the check that fails,
                  naming it and the verl version, when an upgrade changes it
    settings      :data:`WORKER_ENV` and :func:`verl_values`: what the translated config and the
                  workers' environment get when the backend is ``cpu`` (below)

What the cuda backend gets is unchanged: vLLM rollout, FSDP, NCCL, real GPUs in Ray.
"""

from __future__ import annotations

from typing import Any

from slca_exp.engines.verl import keys

PLATFORM_MODULE = "slca_exp.engines.verl.cpu.platform"
"""The module every verl process imports first when the backend is ``cpu``."""
PLATFORM = "cpu"
"""Its name in verl's ``PlatformRegistry`` (``VERL_PLATFORM``)."""
ROLLOUT = "hf"
"""The rollout backend's name (``actor_rollout_ref.rollout.name``)."""

WORKER_ENV: dict[str, str] = {
    "VERL_PLATFORM": PLATFORM,
    # verl picks the training engine by device; its FSDP engine is registered for cuda and npu
    # only, and runs on CPU tensors unchanged (internals.py: ENGINE_BY_DEVICE)
    "VERL_ENGINE_DEVICE": "cuda",
    "TOKENIZERS_PARALLELISM": "false",
}
"""Variables every verl process gets on the ``cpu`` backend (besides the plugin modules)."""


def thread_env() -> dict[str, str]:
    """One intra-op thread per verl process.

    verl runs a trainer worker, a generation server, agent-loop and reward workers, a task
    runner and its TransferQueue side by side; with a thread per core each, their spinning
    threads oversubscribe a small host (an SFT step of the tiny backbone took 6.3 s with two
    threads against 0.7 s with one on a busy 2-core host).
    """
    return {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


ROLLOUT_LOG_ENV = "SLCA_EXP_ROLLOUT_LOG"
"""Names the JSON-lines file the ``hf`` server records each weight update in (unset: none)."""

RAY_LOGICAL_CPUS = 16
"""CPU slots a local Ray declares: verl's actors each ask for one (they mostly wait)."""

_ACTOR, _REF, _ROLLOUT = keys.ACTOR, keys.REF, keys.ROLLOUT
_MODEL = "actor_rollout_ref.model."


def verl_values(use_kl_loss: bool) -> dict[str, Any]:
    """The verl values of the ``cpu`` backend, set after the recipe's own.

    Args:
        use_kl_loss: whether the actor has a KL loss (the reference model then runs).

    Returns:
        verl key -> value: the ``hf`` rollout with its log-probs, float32 training, the
        GPU-only features off (padding removal, flash attention, ``torch.compile``, gradient
        checkpointing) and the Ray slots of a local cluster.

    """
    values: dict[str, Any] = {
        "trainer.device": "cpu",
        _ROLLOUT + "name": ROLLOUT,
        # the server returns its log-probs: verl logs how far they are from the trainer's
        # (training/rollout_probs_diff_*), the check that the server has the trainer's weights
        _ROLLOUT + "calculate_log_probs": True,
        _ROLLOUT + "agent.num_workers": 1,
        _ACTOR + "use_torch_compile": False,
        _ACTOR + "fsdp_config.use_torch_compile": False,
        _MODEL + "use_remove_padding": False,
        _MODEL + "enable_gradient_checkpointing": False,
        _MODEL + "override_config": {"attn_implementation": "eager"},
        "reward.num_workers": 1,
        "data.dataloader_num_workers": 0,  # prompts are read in the trainer: no 8 workers
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
        "ray_kwargs.ray_init.num_cpus": RAY_LOGICAL_CPUS,
    }
    if use_kl_loss:
        # verl gives a forward-only reference model a pinned-memory CPU offload, which CPU-only
        # torch refuses (internals.py: REF_OFFLOAD); as a trainable model it is not offloaded
        values.update(
            {
                _REF + "fsdp_config.use_torch_compile": False,
                _REF + "fsdp_config.forward_only": False,
            }
        )
    return values


FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
"""FSDP mixed precision in float32: the trainer computes what the float32 server samples with
(verl's default, bfloat16 parameters, is a GPU default; on CPU it is also slower)."""

NEW_KEYS = (
    "ray_kwargs.ray_init.num_gpus",
    _REF + "optim",
    _ACTOR + "fsdp_config.mixed_precision",
    _REF + "fsdp_config.mixed_precision",
)
"""Keys the ``cpu`` backend adds to verl's config (:func:`new_values`)."""


def new_values(use_kl_loss: bool, gpus_per_node: int) -> dict[str, Any]:
    """Keys verl's config does not have, added for the ``cpu`` backend.

    ``ray_kwargs.ray_init.num_gpus``: the logical GPU slots of a local Ray, one per trainer
    worker (``engine.verl.n_gpus_per_node``: verl's resource pools ask Ray for GPUs only, one
    per worker process); the reference model's
    ``optim`` (an interpolation of the actor's): a reference model that is not forward-only
    builds an optimizer, which it never steps.
    """
    values: dict[str, Any] = {
        "ray_kwargs.ray_init.num_gpus": gpus_per_node,
        _ACTOR + "fsdp_config.mixed_precision": dict(FP32),
    }
    if use_kl_loss:
        values[_REF + "optim"] = "${actor_rollout_ref.actor.optim}"
        values[_REF + "fsdp_config.mixed_precision"] = dict(FP32)
    return values


def sft_values() -> dict[str, Any]:
    """The verl values of the ``cpu`` backend in the SFT stage's config (``sft_trainer_engine``)."""
    return {
        "trainer.device": "cpu",
        "engine.use_torch_compile": False,
        "model.use_remove_padding": False,
        "model.enable_gradient_checkpointing": False,
        "model.override_config": {"attn_implementation": "eager"},
        "engine.mixed_precision": dict(FP32),
    }


KEYS = (*verl_values(True), *new_values(True, 1))
"""Every verl key the ``cpu`` backend sets (a problem on one names ``engine.verl.backend``)."""
SFT_KEYS = tuple(sft_values())
SFT_NEW_KEYS = ("engine.mixed_precision",)
"""Keys the ``cpu`` backend adds to the SFT stage's config."""
"""The same for the SFT stage's config."""


def problems(strategy: str, tensor_parallel: int) -> list[Any]:
    """What the ``cpu`` backend cannot run, each naming its key and the fix.

    Args:
        strategy: ``engine.verl.strategy``.
        tensor_parallel: ``engine.verl.tensor_model_parallel_size``.

    """
    from slca_exp.core.problems import Problem

    found = []
    if strategy != "fsdp2":
        found.append(
            Problem(
                "engine.verl.strategy",
                f"the cpu backend trains with FSDP2; {strategy!r} (FSDP1) refuses parameters on "
                "the CPU",
                "set engine.verl.strategy=fsdp2",
            )
        )
    if tensor_parallel != 1:
        found.append(
            Problem(
                "engine.verl.tensor_model_parallel_size",
                f"the cpu backend's rollout server is one process; tensor parallel size "
                f"{tensor_parallel} needs vLLM on GPUs",
                "set engine.verl.tensor_model_parallel_size=1 (or engine.verl.backend=cuda)",
            )
        )
    return found
