"""A service option (``service/<name>.yaml``) with its launcher profile, checked as one.

Every problem is found before anything is submitted and named with its key: the definition's
own fields (:func:`slca_exp.services.definition.command_problems`), the profile's
(:func:`slca_exp.launch.profiles.load_profile`), and what only the two together can say:
vLLM needs GPUs (unless it is its CPU build), its tensor parallel size must divide them, a
service is one server on one node; a built-in backbone (``builtin:<experiment>``) must be one.
"""

from __future__ import annotations

from collections.abc import Sequence

from slca_exp.core.problems import Problem
from slca_exp.launch.builtin_models import builtin_problems, is_builtin
from slca_exp.launch.profiles import LauncherProfile, load_profile
from slca_exp.preflight.options import load_option, option_names
from slca_exp.services.definition import ServiceDefinition, command_problems

GROUP = "service"


def service_names(extra_config_dirs: Sequence[str] = ()) -> list[str]:
    """Every service option of the packaged tree and the user's config folders."""
    return option_names(GROUP, extra_config_dirs)


def load_service(
    name: str,
    overrides: Sequence[str] = (),
    launcher: str | None = None,
    launcher_overrides: Sequence[str] = (),
    extra_config_dirs: Sequence[str] = (),
) -> tuple[ServiceDefinition | None, str, LauncherProfile | None, list[Problem]]:
    """The service ``name`` with its overrides, and the profile its job runs with.

    Args:
        name: the option (file stem); the definition's ``name`` defaults to it.
        overrides: ``service.<key>=<value>``.
        launcher: the profile (default: the definition's ``launcher``).
        launcher_overrides: ``launcher.<key>=<value>``.
        extra_config_dirs: ``--config-dir`` folders.

    Returns:
        ``(definition, profile name, profile, problems)``; nothing may be submitted unless
        ``problems`` is empty.

    """
    definition, problems = load_option(GROUP, ServiceDefinition, name, overrides, extra_config_dirs)
    if definition is None:
        return None, launcher or "", None, problems
    if not definition.name:
        definition.name = name
    problems += [Problem(*found) for found in command_problems(definition)]
    if definition.uses_vllm and is_builtin(definition.model):
        problems += builtin_problems(definition.model)
    profile_name = launcher or definition.launcher
    needs = [f"launcher.{key}={_value(value)}" for key, value in definition.resources.items()]
    profile, found = load_profile(profile_name, [*needs, *launcher_overrides], extra_config_dirs)
    problems += found
    if profile is not None:
        problems += launcher_problems(definition, profile_name, profile)
    return definition, profile_name, profile, problems


def launcher_problems(
    definition: ServiceDefinition, profile_name: str, profile: LauncherProfile
) -> list[Problem]:
    """What the definition and the profile cannot do together, each naming its key.

    >>> from slca_exp.launch.profiles import LauncherProfile
    >>> gpus = LauncherProfile(kind="submitit_slurm", gpu=True, gpus_per_node=8)
    >>> judge = ServiceDefinition(name="j", model="m", tensor_parallel_size=3)
    >>> [p.key for p in launcher_problems(judge, "slurm_gpu_8x", gpus)]
    ['service.tensor_parallel_size']
    """
    problems = []
    if profile.kind != "submitit_slurm":
        problems.append(
            Problem(
                "launcher",
                f"the profile {profile_name!r} runs jobs with {profile.kind}; a service is a "
                "SLURM job of its own, which runs until `slca-exp serve down`",
                "pick a SLURM profile: launcher=slurm_gpu_8x (or slurm_cpu for a service "
                "with a command of its own)",
            )
        )
    if profile.nodes != 1 or profile.tasks_per_node != 1:
        problems.append(
            Problem(
                "launcher.nodes",
                f"{profile.nodes} nodes x {profile.tasks_per_node} tasks: a service is one "
                "server process on one node",
                "set launcher.nodes=1 launcher.tasks_per_node=1",
            )
        )
    if not definition.uses_vllm or definition.device == "cpu":
        return problems
    gpus = profile.gpus_per_node if profile.gpu else 0
    tp, pp = definition.tensor_parallel_size, definition.pipeline_parallel_size
    if gpus == 0:
        problems.append(
            Problem(
                "launcher.gpus_per_node",
                f"vLLM serves {definition.model} on GPUs; the profile {profile_name!r} asks for "
                "none",
                f"pick a GPU profile (launcher=slurm_gpu_8x) with at least {tp * pp} GPUs, or "
                "serve a small model with vLLM's CPU build (service.device=cpu)",
            )
        )
    elif gpus % tp:
        problems.append(
            Problem(
                "service.tensor_parallel_size",
                f"{tp} does not divide the job's {gpus} GPUs (launcher.gpus_per_node)",
                "give a divisor of launcher.gpus_per_node (or ask for a multiple of it)",
            )
        )
    elif tp * pp > gpus:
        problems.append(
            Problem(
                "service.pipeline_parallel_size",
                f"tensor x pipeline parallel = {tp} x {pp} = {tp * pp} GPUs; the job has {gpus}",
                f"lower service.pipeline_parallel_size, or ask for launcher.gpus_per_node="
                f"{tp * pp}",
            )
        )
    return problems


def _value(value: object) -> str:
    """A resource value as an override's value (``null`` for None, strings quoted)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)
