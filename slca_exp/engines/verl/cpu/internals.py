"""The verl internals the ``cpu`` backend leans on, and a check of each for a verl upgrade.

verl 0.9.1 has public extension points for most of what a CPU backend needs (the platform
registry, the replica registry, ``VERL_ENGINE_DEVICE``, the trainer registry and hooks). Where
it has none, the backend relies on how verl's code happens to be written. Each such place is
listed here with what breaks if it changes; :func:`check` finds out, and names the internal
and the verl version, so an upgrade fails in a test and not in the middle of a run.

GLOO_ORDER
    ``verl.utils.distributed.initialize_global_process_group_ray`` builds its backend string
    ``"cpu:gloo,<device>:<backend>"`` (which names ``cpu`` twice on the CPU: torch refuses it),
    and it asks the platform for its collective backend *before* it checks whether a process
    group is open. The platform opens a plain gloo group in that call
    (``platform.open_gloo_group``), so verl finds one and skips its own.
ROLLOUT_REGISTRY
    The worker-side rollout class is looked up in the private dict
    ``verl.workers.rollout.base._ROLLOUT_REGISTRY`` keyed by ``(name, "async")``; there is no
    register function. The ``hf`` backend adds its entry there (its replica goes through the
    public ``RolloutReplicaRegistry.register``).
REF_OFFLOAD
    A forward-only reference model (``actor_rollout_ref.ref.fsdp_config.forward_only``) always
    gets FSDP2's ``CPUOffloadPolicy(pin_memory=True)``, and pinned memory needs an accelerator.
    The backend makes the reference model trainable (``forward_only=false``, never stepped),
    which needs ``actor_rollout_ref.ref.optim``: verl's FSDP engine config must keep its
    ``forward_only`` and ``mixed_precision`` fields.
REPLICA_PROTOCOL
    ``RolloutReplica`` leaves only ``launch_servers`` abstract and reads the launched server
    from ``self.servers``, ``self._server_handle`` and ``self._server_address``; its agent
    loops call the server's ``generate(prompt_ids=, sampling_params=, request_id=, ...)`` and
    read a ``TokenOutput``. ``HFReplica`` and ``HFServer`` implement exactly that.
ADAPTER_PROTOCOL
    The trainer worker builds the rollout adapter as ``cls(config=, model_config=,
    device_mesh=, replica_rank=)`` and pushes weights with ``update_weights(weights,
    wire_format="named_tensors", global_steps=...)``: ``HFServerAdapter`` implements it.
RAY_GPU_SLOTS
    verl's resource pools ask Ray for ``GPU`` (or ``NPU``) slots only, and its availability
    check counts nothing else: a CPU node declares logical GPU slots.
VLLM_EXTENSION_SETTING
    verl's ``vLLMHttpServer.launch_server`` builds vLLM's arguments with its own
    ``worker_extension_cls`` first and ``actor_rollout_ref.rollout.engine_kwargs.vllm`` after
    it, so the setting replaces verl's extension with the backend's (vllm_worker.py).
VLLM_WEIGHT_SYNC
    The backend's extension subclasses verl's ``vLLMColocateWorkerExtension`` and replaces only
    ``update_weights_from_ipc(peft_config, base_sync_done, use_shm)``, reusing its
    ``_get_zmq_handle``, ``_update_weights`` and ``_iter_all_models_with_config``, verl's
    ``BucketedWeightReceiver(zmq_handle=, device=, use_shm=).receive_weights(on_bucket_received=)``
    and vLLM's ``initialize_layerwise_reload`` / ``finalize_layerwise_reload``.
SFT_TRAINER
    The SFT stage runs ``verl.trainer.sft_trainer_ray.SFTTrainer(config=...).fit()`` after
    joining the run's Ray cluster (verl's own entry point calls a bare ``ray.init()``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Internal:
    """One verl internal the backend relies on.

    Attributes:
        name: its name in the module docstring.
        where: the verl module or object.
        check: returns ``None`` when verl still behaves as relied on, else what changed.

    """

    name: str
    where: str
    check: Callable[[], str | None]


def _gloo_order() -> str | None:
    from verl.utils import distributed

    source = inspect.getsource(distributed.initialize_global_process_group_ray)
    backend, opened = source.find("get_nccl_backend()"), source.find("is_initialized()")
    if backend < 0 or opened < 0:
        return "it no longer asks get_nccl_backend() and is_initialized() (rewritten)"
    if backend > opened:
        return "it now checks is_initialized() before asking for the backend"
    return None


def _rollout_registry() -> str | None:
    from verl.workers.rollout import base

    table = getattr(base, "_ROLLOUT_REGISTRY", None)
    if not isinstance(table, dict) or ("vllm", "async") not in table:
        return "the (name, mode) -> class table _ROLLOUT_REGISTRY is gone or changed shape"
    if "_ROLLOUT_REGISTRY[(rollout_name, mode)]" not in inspect.getsource(base.get_rollout_class):
        return "get_rollout_class no longer reads _ROLLOUT_REGISTRY[(rollout_name, mode)]"
    return None


def _ref_offload() -> str | None:
    import dataclasses

    from verl.workers.config import FSDPEngineConfig

    fields = {f.name for f in dataclasses.fields(FSDPEngineConfig)}
    missing = {"forward_only", "mixed_precision", "strategy"} - fields
    return f"FSDPEngineConfig lost {sorted(missing)}" if missing else None


def _replica_protocol() -> str | None:
    from verl.workers.rollout.replica import RolloutReplica, TokenOutput

    abstract = set(getattr(RolloutReplica, "__abstractmethods__", set()))
    if abstract != {"launch_servers"}:
        return f"RolloutReplica's abstract methods are now {sorted(abstract)}"
    source = inspect.getsource(RolloutReplica)
    for attribute in ("_server_handle", "_server_address", "self.servers"):
        if attribute not in source:
            return f"RolloutReplica no longer uses {attribute}"
    wanted = {"token_ids", "log_probs", "stop_reason", "num_preempted", "extra_fields"}
    missing = wanted - set(TokenOutput.model_fields)
    return f"TokenOutput lost {sorted(missing)}" if missing else None


def _adapter_protocol() -> str | None:
    from verl.workers.rollout.base import BaseRollout

    params = inspect.signature(BaseRollout.update_weights).parameters
    if "weights" not in params or "wire_format" not in params:
        return f"BaseRollout.update_weights takes {list(params)}"
    init = inspect.signature(BaseRollout.__init__).parameters
    missing = {"config", "model_config", "device_mesh"} - set(init)
    return f"BaseRollout.__init__ lost {sorted(missing)}" if missing else None


def _ray_gpu_slots() -> str | None:
    from verl.single_controller.ray.base import ResourcePoolManager

    source = inspect.getsource(ResourcePoolManager._check_resource_available)  # noqa: SLF001
    return None if '"GPU"' in source else "the availability check no longer counts GPU slots"


def _vllm_extension_setting() -> str | None:
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    source = inspect.getsource(vLLMHttpServer.launch_server)
    ours, theirs = source.find('"worker_extension_cls":'), source.find("**engine_kwargs")
    if ours < 0 or theirs < 0:
        return "it no longer passes worker_extension_cls and **engine_kwargs to vLLM"
    if theirs < ours:
        return "engine_kwargs now come before its worker_extension_cls (verl's would win)"
    return None


def _vllm_weight_sync() -> str | None:
    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension
    from vllm.model_executor.model_loader import reload

    params = inspect.signature(vLLMColocateWorkerExtension.update_weights_from_ipc).parameters
    if list(params) != ["self", "peft_config", "base_sync_done", "use_shm"]:
        return f"update_weights_from_ipc takes {list(params)}"
    for name in ("_get_zmq_handle", "_update_weights", "_iter_all_models_with_config"):
        if not callable(getattr(vLLMColocateWorkerExtension, name, None)):
            return f"vLLMColocateWorkerExtension lost {name}"
    receiver = bucketed_weight_transfer.BucketedWeightReceiver
    init = set(inspect.signature(receiver.__init__).parameters)
    if not {"zmq_handle", "device", "use_shm"} <= init:
        return f"BucketedWeightReceiver takes {sorted(init)}"
    if "on_bucket_received" not in inspect.signature(receiver.receive_weights).parameters:
        return "BucketedWeightReceiver.receive_weights no longer takes on_bucket_received"
    missing = {"initialize_layerwise_reload", "finalize_layerwise_reload"} - set(dir(reload))
    return f"vLLM's model_loader.reload lost {sorted(missing)}" if missing else None


def _sft_trainer() -> str | None:
    from verl.trainer.sft_trainer_ray import SFTTrainer

    params = inspect.signature(SFTTrainer.__init__).parameters
    if "config" not in params or not callable(getattr(SFTTrainer, "fit", None)):
        return "SFTTrainer(config=...).fit() is no longer how it runs"
    return None


INTERNALS: tuple[Internal, ...] = (
    Internal(
        "GLOO_ORDER", "verl.utils.distributed.initialize_global_process_group_ray", _gloo_order
    ),
    Internal("ROLLOUT_REGISTRY", "verl.workers.rollout.base._ROLLOUT_REGISTRY", _rollout_registry),
    Internal("REF_OFFLOAD", "verl.workers.config.FSDPEngineConfig", _ref_offload),
    Internal("REPLICA_PROTOCOL", "verl.workers.rollout.replica.RolloutReplica", _replica_protocol),
    Internal("ADAPTER_PROTOCOL", "verl.workers.rollout.base.BaseRollout", _adapter_protocol),
    Internal(
        "RAY_GPU_SLOTS", "verl.single_controller.ray.base.ResourcePoolManager", _ray_gpu_slots
    ),
    Internal(
        "VLLM_EXTENSION_SETTING",
        "verl.workers.rollout.vllm_rollout.vllm_async_server.vLLMHttpServer.launch_server",
        _vllm_extension_setting,
    ),
    Internal(
        "VLLM_WEIGHT_SYNC",
        "verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension",
        _vllm_weight_sync,
    ),
    Internal("SFT_TRAINER", "verl.trainer.sft_trainer_ray.SFTTrainer", _sft_trainer),
)
"""Every internal of the module docstring, in its order."""


def check() -> list[str]:
    """What changed in the installed verl, one line per internal; ``[]`` when nothing did."""
    from importlib.metadata import version

    found = []
    for internal in INTERNALS:
        try:
            what = internal.check()
        except Exception as err:  # noqa: BLE001 - an import or attribute gone is a change too
            what = f"{type(err).__name__}: {err}"
        if what:
            found.append(
                f"verl {version('verl')}: the cpu backend relies on {internal.name} "
                f"({internal.where}): {what}; see slca_exp/engines/verl/cpu/internals.py"
            )
    return found
