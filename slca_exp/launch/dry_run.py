"""``slca-exp train --dry-run``: the jobs, the resources and the sbatch script; nothing submitted.

The script is submitit's own (``submitit.slurm.slurm._make_sbatch_string``), fed the parameters
hydra-submitit-launcher would give it: the same renames (``timeout_min`` -> ``--time``,
``mem_gb`` -> ``--mem``, ...) and, for a sweep, one array job of every job. Only the submitit
folder differs from a real submission in its date (``hydra.sweep.dir`` fixes it).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Sequence

from slca_exp.launch.profiles import LauncherProfile

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


def describe(name: str, profile: LauncherProfile, jobs: Sequence[Sequence[str]]) -> str:
    """The dry-run report of ``jobs`` (override lists) under the profile ``name``."""
    n = len(jobs)
    lines = [
        f"slca-exp: dry run of {n} job{'s' if n != 1 else ''} with launcher={name} "
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
