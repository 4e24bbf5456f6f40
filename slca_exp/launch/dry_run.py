"""``slca-exp train --dry-run``: the jobs, the resources and the sbatch script; nothing submitted.

The script is submitit's own (``submitit.slurm.slurm._make_sbatch_string``), fed the parameters
hydra-submitit-launcher would give it: the same renames (``timeout_min`` -> ``--time``,
``mem_gb`` -> ``--mem``, ...) and, for a sweep, one array job of every job. Only the submitit
folder differs from a real submission in its date (``hydra.sweep.dir`` fixes it).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time
from collections.abc import Sequence

from slca_exp.core.problems import Problem
from slca_exp.launch.profiles import LauncherProfile, cross_problems

KINDS = {
    "BasicLauncher": "basic",
    "LocalLauncher": "submitit_local",
    "SlurmLauncher": "submitit_slurm",
}
"""Hydra launcher class -> the kind of profile that describes it (``launch/profiles.py``)."""

RESOURCES = (
    "partition",
    "account",
    "qos",
    "nodes",
    "tasks_per_node",
    "gpus_per_node",
    "cpus_per_task",
    "mem_gb",
    "timeout_min",
    "array_parallelism",
    "max_num_timeout",
    "signal_delay_s",
)


def hydra_launcher(
    overrides: Sequence[str], config_name: str, extra_config_dirs: Sequence[str] = ()
) -> tuple[str, LauncherProfile | None, list[Problem]] | None:
    """The launcher chosen with ``hydra/launcher=`` or ``hydra.launcher.<key>=``, as a profile.

    A sweep may pick hydra-submitit-launcher's configs directly (docs/slurm.md)
    (``hydra/launcher=submitit_slurm hydra.launcher.partition=cpu``): Hydra composes them, and
    the result is read back as a :class:`LauncherProfile`, so that the dry run describes, and
    the profile checks (partition, node sizes) judge, what would really be submitted.

    Returns:
        ``None`` when the overrides do not touch the launcher, else ``(name, profile or None,
        problems)``.

    """
    chosen = [o for o in overrides if o.startswith(("hydra/launcher=", "hydra.launcher."))]
    if not chosen:
        return None
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from slca_exp.preflight.compose import hydra_context

    dirs = ",".join(f"file://{os.path.abspath(d)}" for d in extra_config_dirs)
    searchpath = [f"hydra.searchpath=[{dirs}]"] if dirs else []
    name = " ".join(chosen)
    try:
        with hydra_context():
            hydra = compose(config_name, [*chosen, *searchpath], return_hydra_config=True).hydra
    except (HydraException, OmegaConfBaseException) as err:
        what = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
        return name, None, [Problem("hydra/launcher", what, "fix the launcher override")]
    launcher = hydra.launcher
    kind = KINDS.get(str(launcher.get("_target_", "")).rsplit(".", 1)[-1])
    if kind is None:
        unknown = Problem(
            "hydra/launcher",
            f"launcher {launcher.get('_target_')!r} is not one slca-exp can check",
            "use launcher=<profile> (launchers/), or hydra/launcher=submitit_slurm | "
            "submitit_local | basic",
        )
        return name, None, [unknown]
    fields = {f.name for f in dataclasses.fields(LauncherProfile)}
    values = {
        k: v
        for k, v in OmegaConf.to_container(launcher, resolve=False).items()
        if k in fields and v is not None and not (isinstance(v, str) and "${" in v)
    }
    values["gpu"] = bool(values.get("gpus_per_node"))  # asked for: a GPU partition
    profile = LauncherProfile(**{**values, "kind": kind})
    return name, profile, cross_problems(profile)


def describe(name: str, profile: LauncherProfile, jobs: Sequence[Sequence[str]]) -> str:
    """The dry-run report of ``jobs`` (override lists) under the launcher ``name``.

    ``name`` as the user chose it: ``launcher=slurm_cpu``, ``hydra/launcher=submitit_slurm``.
    """
    n = len(jobs)
    lines = [
        f"slca-exp: dry run of {n} job{'s' if n != 1 else ''} with {name} "
        f"({profile.kind}); nothing is submitted or created",
        "",
        "jobs:",
        *(f"  #{i}: {' '.join(job) or '(defaults)'}" for i, job in enumerate(jobs)),
        "",
    ]
    if profile.kind == "basic":
        return "\n".join([*lines, "runs here, one job after another (no SLURM, no sbatch)"])
    lines += ["resources:", *(f"  {k}: {getattr(profile, k)}" for k in RESOURCES), ""]
    if profile.kind == "submitit_local":
        return "\n".join([*lines, "each job in its own local process (no SLURM, no sbatch)"])
    return "\n".join([*lines, "sbatch script:", sbatch_script(profile, n, _sweep_dir(jobs))])


def sbatch_script(profile: LauncherProfile, n_jobs: int, sweep_dir: str) -> str:
    """The sbatch file submitit writes for ``n_jobs`` jobs of ``profile`` (an array when > 1)."""
    from submitit.slurm.slurm import SlurmExecutor, _convert_mem, _make_sbatch_string

    base = {
        "name": "train",
        "timeout_min": profile.timeout_min,
        "mem_gb": profile.mem_gb,
        "nodes": profile.nodes,
        "cpus_per_task": profile.cpus_per_task,
        "gpus_per_node": profile.gpus_per_node or None,
        "tasks_per_node": profile.tasks_per_node,
    }
    renames = SlurmExecutor._equivalence_dict()
    params = {renames[k]: v for k, v in base.items() if v is not None}
    if "mem" in params:
        params["mem"] = _convert_mem(params["mem"])
    folder = os.path.join(os.path.abspath(sweep_dir), ".submitit", "%j")
    command = " ".join(
        [shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(folder)]
    )
    return _make_sbatch_string(
        command=command,
        folder=folder,
        partition=profile.partition,
        account=profile.account,
        qos=profile.qos,
        setup=list(profile.setup) or None,
        signal_delay_s=profile.signal_delay_s,
        array_parallelism=profile.array_parallelism,
        map_count=n_jobs if n_jobs > 1 else None,
        **params,
    )


def _sweep_dir(jobs: Sequence[Sequence[str]]) -> str:
    for override in jobs[0] if jobs else ():
        if override.startswith("hydra.sweep.dir="):
            return override.split("=", 1)[1]
    return time.strftime("multirun/%Y-%m-%d/%H-%M-%S")  # Hydra's default hydra.sweep.dir
