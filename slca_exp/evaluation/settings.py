"""The ``eval`` option: how a checkpoint is served for a benchmark, and where the eval runs.

``eval/<name>.yaml`` holds one :class:`EvalSettings`: ``eval=gpu`` (the default: vLLM's CUDA
build, the ``gpu`` extra) or ``eval=cpu`` (vLLM's CPU build, which ``make install`` puts here:
tiny checkpoints, CI). The checkpoint is served by ``vllm serve`` with vLLM's tool-call parser
for the trained chat template (``tool_call_parser: hermes`` reads Qwen-style ``<tool_call>``
blocks, the layout of every shipped backbone), so the benchmark's own client gets OpenAI tool
calls back, as the paper's evaluation did.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slca_exp.config.fields import param
from slca_exp.core.problems import Problem
from slca_exp.engines.verl.cpu import VLLM_HEAD_SIZES
from slca_exp.services.definition import DTYPES, ServiceDefinition
from slca_exp.services.vllm_options import DEVICES

GROUP = "eval"
DEFAULT = "gpu"


@dataclass
class EvalSettings:
    """How the checkpoint is served and where the benchmark runs (``eval`` option)."""

    device: str = param(
        "cuda",
        "where vLLM serves the checkpoint: cuda (vLLM's CUDA build) | cpu (vLLM's CPU build)",
        choices=DEVICES,
    )
    dtype: str = param("auto", "weights and activations dtype", choices=DTYPES)
    max_model_len: int | None = param(None, "context length; null: the checkpoint's own", gt=0)
    tool_call_parser: str = param(
        "hermes", "vLLM's tool-call parser for the trained chat template (<tool_call> blocks)"
    )
    tensor_parallel_size: int = param(1, "GPUs the checkpoint is split over", gt=0)
    extra_args: list[str] = param(
        default_factory=list, help="more `vllm serve` flags, appended as given"
    )
    command: list[str] | None = param(
        None,
        "the server's own command instead of vLLM's (an OpenAI-compatible server of your own); "
        "may name {python} {host} {port} {model} {served_model_name} {max_model_len}",
    )
    health_timeout_s: float = param(
        1800.0, "how long to wait for the server to answer with the checkpoint", gt=0
    )
    launcher: str = param(
        "local",
        "where the eval runs: local (this process serves and scores) | a SLURM profile "
        "(one job per checkpoint serves and scores it)",
    )
    env_root: str | None = param(
        None,
        "where benchmark environments are built; null: $SLCA_EXP_ENVS, else ~/.cache/slca-exp/envs",
    )
    resources: dict[str, Any] = param(
        default_factory=dict, help="launcher.<key> values the eval's job needs (SLURM only)"
    )
    rescore: bool = param(
        False, "score again even when the run holds scores of this benchmark and checkpoint"
    )


def served_checkpoint(settings: EvalSettings, folder: str, model_id: str) -> ServiceDefinition:
    """The service definition that serves the checkpoint in ``folder`` as ``model_id``.

    >>> d = served_checkpoint(EvalSettings(device="cpu", dtype="float32"), "/ckpt", "run-ab12")
    >>> d.model, d.served_model_name, d.extra_args[:3]
    ('/ckpt', 'run-ab12', ['--enable-auto-tool-choice', '--tool-call-parser', 'hermes'])
    """
    return ServiceDefinition(
        name=model_id,
        role="judge",  # a role is required of a definition; nothing judges through this one
        model=folder,
        served_model_name=model_id,
        device=settings.device,
        tensor_parallel_size=settings.tensor_parallel_size,
        max_model_len=settings.max_model_len,
        dtype=settings.dtype,
        extra_args=[
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            settings.tool_call_parser,
            *settings.extra_args,
        ],
        host="127.0.0.1",
        port=0,
        command=list(settings.command) if settings.command else None,
        health_timeout_s=settings.health_timeout_s,
        launcher=settings.launcher,
        resources=dict(settings.resources),
    )


def settings_problems(settings: EvalSettings) -> list[Problem]:
    """What is wrong with the serving settings, each naming its ``eval.<key>``.

    The ``vllm serve`` line is read against the options of the vLLM build of ``eval.device``,
    as a service's is; serving here (``eval.launcher=local``) needs that build installed.
    """
    from slca_exp.services.definition import vllm_problems

    if settings.command:
        return []
    line = served_checkpoint(settings, "<checkpoint>", "<run>")
    problems = [
        Problem(key.replace("service.", f"{GROUP}.", 1), what, fix)
        for key, what, fix in vllm_problems(line)
    ]
    if settings.launcher == "local":
        problems += _installed_problems(settings.device)
    return problems


def _installed_problems(device: str) -> list[Problem]:
    import importlib.metadata

    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        extra = (
            "the gpu extra (pip install 'slca-exp[gpu]')"
            if device == "cuda"
            else ("make install (vLLM's CPU build)")
        )
        return [
            Problem(
                f"{GROUP}.device",
                "vLLM serves the checkpoint here (eval.launcher=local), and it is not installed",
                f"install it with {extra}, or score on a cluster: eval.launcher=<SLURM profile>",
            )
        ]
    cpu_build = version.endswith("+cpu")
    if cpu_build != (device == "cpu"):
        which = "CPU" if cpu_build else "CUDA"
        return [
            Problem(
                f"{GROUP}.device",
                f"{device}: the vLLM installed here ({version}) is its {which} build",
                "eval=cpu for vLLM's CPU build" if cpu_build else "eval=gpu on a GPU machine",
            )
        ]
    return []


def checkpoint_problems(settings: EvalSettings, folder: Path) -> list[Problem]:
    """What vLLM cannot do with the checkpoint in ``folder`` as ``settings`` serve it."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        return [Problem("RUN_OR_SWEEP", f"{folder} holds no config.json", "score an HF checkpoint")]
    config = json.loads(config_file.read_text())
    problems = []
    if settings.command:
        return problems
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head_dim = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    if settings.device == "cpu" and head_dim is not None and head_dim not in VLLM_HEAD_SIZES:
        problems.append(
            Problem(
                f"{GROUP}.device",
                f"the checkpoint's attention heads are {head_dim} wide; vLLM's CPU build runs "
                f"{', '.join(map(str, VLLM_HEAD_SIZES))}",
                "serve it on a GPU (eval=gpu), or train a backbone whose heads vLLM's CPU "
                "build runs (backbone.arch.num_heads=2 on the tiny backbone: heads 32 wide)",
            )
        )
    longest = config.get("max_position_embeddings")
    if settings.max_model_len and longest and settings.max_model_len > longest:
        problems.append(
            Problem(
                f"{GROUP}.max_model_len",
                f"{settings.max_model_len} is longer than the checkpoint's context "
                f"({longest}, max_position_embeddings)",
                f"give eval.max_model_len={longest} or less, or null for the checkpoint's own",
            )
        )
    return problems


def launcher_profile(settings: EvalSettings, config_dirs: Sequence[str] = ()) -> tuple[Any, list]:
    """The SLURM profile ``eval.launcher`` names, with ``eval.resources`` over it; its problems.

    The checks a service's profile gets apply (a SLURM profile, one node, GPUs for vLLM's CUDA
    build), each problem named with its ``eval.<key>`` where it comes from the eval's settings.
    """
    from slca_exp.launch.profiles import load_profile
    from slca_exp.launch.service_definitions import launcher_problems

    needs = [f"launcher.{key}={value}" for key, value in settings.resources.items()]
    profile, problems = load_profile(settings.launcher, needs, config_dirs)
    if profile is None:
        return None, [_as_eval(p) for p in problems]
    line = served_checkpoint(settings, "<checkpoint>", "<run>")
    problems = [_as_eval(p) for p in launcher_problems(line, settings.launcher, profile)]
    return (None, problems) if problems else (profile, [])


def _as_eval(problem: Problem) -> Problem:
    """A profile's or a service's problem, keyed as the eval's settings set it."""
    key = problem.key
    if key == "launcher":
        key = f"{GROUP}.launcher"
    elif key.startswith("launcher."):  # the profile's fields are set through eval.resources
        key = f"{GROUP}.resources.{key.removeprefix('launcher.')}"
    elif key.startswith("service."):
        key = f"{GROUP}.{key.removeprefix('service.')}"
    fix = (
        problem.fix.replace("launcher.", f"{GROUP}.resources.")
        .replace("launcher=", f"{GROUP}.launcher=")
        .replace("service.", f"{GROUP}.")
    )
    return Problem(key, problem.what, fix)
