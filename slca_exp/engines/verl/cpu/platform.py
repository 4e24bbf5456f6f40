"""The ``cpu`` platform for verl (``VERL_PLATFORM=cpu``), and the ``hf`` rollout backend's names.

verl asks one platform object for everything device-specific: device name, the torch device
module, the collective backend, the Ray resource a worker needs. This module registers a
platform that answers for the CPU and registers the ``hf`` rollout backend
(:mod:`slca_exp.engines.verl.cpu.rollout`) with verl's rollout registries.

It must be imported before anything asks verl for its platform (verl resolves it once per
process, and importing verl's trainer asks): every verl process gets it first in
``VERL_USE_EXTERNAL_MODULES``, which ``import verl`` imports before its entry-point plugins.
Importing it outside verl's workers changes nothing unless ``VERL_PLATFORM=cpu``.
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from typing_extensions import override
from verl.plugin.platform import PlatformBase, PlatformRegistry

from slca_exp.engines.verl.cpu import HF_ROLLOUT, PLATFORM

ROLLOUT_CLASS = "slca_exp.engines.verl.cpu.rollout.HFServerAdapter"
"""The worker-side rollout class of the ``hf`` backend (what verl's worker instantiates)."""


def _none(*_args: Any, **_kwargs: Any) -> None:  # noqa: ANN401
    return None


def _zero(*_args: Any, **_kwargs: Any) -> int:  # noqa: ANN401
    return 0


class _NoStream:
    """A stream or event on the CPU: work is done when the call returns."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:  # noqa: ANN401
        pass

    synchronize = wait_stream = wait_event = wait = record = _none

    def record_event(self, *_args: Any) -> _NoStream:  # noqa: ANN401
        return _NoStream()

    def query(self) -> bool:
        return True


@contextmanager
def _no_stream(*_args: Any, **_kwargs: Any) -> Iterator[None]:  # noqa: ANN401
    yield


def _memory() -> tuple[int, int]:
    """(free, total) bytes, as ``torch.cuda.mem_get_info`` reports them for a GPU."""
    import psutil

    vm = psutil.virtual_memory()
    return vm.available, vm.total


DEVICE_MODULE = types.SimpleNamespace(
    is_available=lambda: True,
    device_count=lambda: 1,
    current_device=lambda: 0,
    set_device=_none,
    synchronize=_none,
    empty_cache=_none,
    ipc_collect=_none,
    memory_allocated=_zero,
    memory_reserved=_zero,
    max_memory_allocated=_zero,
    max_memory_reserved=_zero,
    reset_peak_memory_stats=_none,
    mem_get_info=lambda *_: _memory(),
    set_per_process_memory_fraction=_none,
    get_rng_state=lambda *_: torch.get_rng_state(),
    set_rng_state=lambda state, *_: torch.set_rng_state(state),
    manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed,
    get_device_name=lambda *_: "cpu",
    current_stream=lambda *_: _NoStream(),
    stream=_no_stream,
    Stream=_NoStream,
    Event=_NoStream,
)
"""What verl calls on ``get_torch_device()`` (the ``torch.cuda`` of a GPU), for the CPU."""


def open_gloo_group() -> None:
    """Open the default process group of a verl worker with plain ``gloo``.

    verl's worker asks the platform for its collective backend while building the backend
    string ``"cpu:gloo,<device>:<backend>"`` and only then checks whether a group exists
    (internals.py: GLOO_ORDER); on the CPU that string names ``cpu`` twice, which torch
    refuses. Opening the group here, with the rank and rendezvous verl's worker group set in
    the environment (``WG_BACKEND=ray``), makes verl find it open. Elsewhere: nothing.
    """
    dist = torch.distributed
    env = os.environ
    if not dist.is_available() or dist.is_initialized():
        return
    if env.get("WG_BACKEND") != "ray" or "RANK" not in env or "MASTER_ADDR" not in env:
        return
    dist.init_process_group(
        backend="gloo",
        rank=int(env["RANK"]),
        world_size=int(env.get("WORLD_SIZE", "1")),
        init_method=env.get("DIST_INIT_METHOD") or None,
    )


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """verl's platform interface answered for the CPU (gloo, one logical GPU slot per worker)."""

    @override
    @property
    def device_name(self) -> str:
        return "cpu"

    @override
    @property
    def vendor_name(self) -> str:
        return "cpu"

    @override
    @property
    def device_module(self) -> types.SimpleNamespace:
        return DEVICE_MODULE

    @override
    def is_available(self) -> bool:
        return True

    @override
    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # never picked by verl's auto-detection: only by VERL_PLATFORM=cpu
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM

    @override
    def current_device(self) -> str:  # type: ignore[override]
        return "cpu"  # verl writes tensor.to(get_device_id()) and torch.device(get_device_id())

    @override
    def device_count(self) -> int:
        return 1

    @override
    def set_device(self, device_index: int) -> None:
        return None

    @override
    def synchronize(self, device_index: int | None = None) -> None:
        return None

    @override
    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    @override
    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    @override
    def set_allocator_settings(self, settings: str) -> None:
        return None

    @override
    def empty_cache(self) -> None:
        return None

    @override
    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    @override
    def communication_backend_name(self) -> str:
        open_gloo_group()
        return "gloo"

    @override
    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @override
    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    @override
    def profiler_start(self) -> None:
        return None

    @override
    def profiler_stop(self) -> None:
        return None

    @override
    def ray_resource_name(self) -> str:
        # verl's resource pools count only GPU/NPU slots: a CPU node declares logical GPUs
        return "GPU"

    @override
    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    @override
    def ray_noset_envvars(self) -> list[str]:
        return []

    @override
    def is_ipc_supported(self) -> bool:
        return False

    @override
    def cudart(self) -> None:
        return None


def _register_rollout() -> None:
    """Make ``rollout.name=hf`` known to verl's two rollout registries."""
    import importlib

    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(
        HF_ROLLOUT,
        lambda: importlib.import_module("slca_exp.engines.verl.cpu.rollout").HFReplica,
    )
    # the worker-side class has no register function: its table is private (internals.py)
    base._ROLLOUT_REGISTRY[(HF_ROLLOUT, "async")] = ROLLOUT_CLASS  # noqa: SLF001


_register_rollout()
