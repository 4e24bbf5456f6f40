"""Cluster profiles (``launchers/<name>.yaml``): where the jobs of a command run, and with what.

``slca-exp train launcher=<name> [launcher.<key>=<value> ...]`` loads the profile from the
``launcher`` folder of the config tree (``slca_exp/conf/launcher``, or a ``--config-dir``
folder), checks it against :class:`LauncherProfile` and turns it into the hydra-submitit-launcher
config: the profile is stored in Hydra's ConfigStore as ``hydra/launcher=slca_<name>`` (a
``SlurmQueueConf`` or ``LocalQueueConf`` with the profile's values), so no value has to survive
the override grammar. Adding a cluster is adding one YAML file.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from slca_exp.config.fields import param
from slca_exp.core.problems import Problem
from slca_exp.launch.filesystems import filesystem_type, is_network
from slca_exp.preflight.options import load_option, option_names

KINDS = ("basic", "submitit_local", "submitit_slurm")
GROUP = "launcher"
DEFAULT = "local"

# ``${slca.python_prefix:}`` in a profile: the environment (venv) of the Python that submits, as
# an absolute path. Jobs start in the submission folder, where a relative ``.venv`` may not exist.
if not OmegaConf.has_resolver("slca.python_prefix"):
    OmegaConf.register_new_resolver("slca.python_prefix", lambda: sys.prefix)


@dataclass
class LauncherProfile:
    """One cluster shape: the launcher and the resources of every job of a command."""

    kind: str = param(
        "basic",
        "basic (here, one job after another) | submitit_local (a process per job) | "
        "submitit_slurm (one sbatch array job per sweep)",
        choices=KINDS,
    )
    gpu: bool = param(False, "the partition has GPUs; false refuses gpus_per_node > 0")
    partition: str | None = param(None, "SLURM partition (sbatch --partition); null: default")
    account: str | None = param(None, "SLURM account; read it from $SLURM_ACCOUNT")
    qos: str | None = param(None, "SLURM quality of service; read it from $SLURM_QOS")
    nodes: int = param(1, "nodes per job", ge=1)
    tasks_per_node: int = param(1, "tasks (processes) per node; every task runs the job", ge=1)
    gpus_per_node: int = param(0, "GPUs per node (0: none asked)", ge=0)
    cpus_per_task: int | None = param(None, "CPUs per task; null: the cluster default", gt=0)
    mem_gb: int | None = param(None, "memory per node in GB; null: the cluster default", gt=0)
    timeout_min: int = param(60, "wall-clock limit of a job in minutes", gt=0)
    setup: list[str] = param(
        default_factory=list, help="shell lines run before the job (module loads, venv activation)"
    )
    array_parallelism: int = param(256, "most jobs of a sweep running at once", gt=0)
    max_num_timeout: int = param(0, "requeues allowed after a time limit or preemption", ge=0)
    signal_delay_s: int = param(120, "seconds between the USR2 signal and the time limit", ge=0)


def profile_names(extra_config_dirs: Sequence[str] = ()) -> list[str]:
    """Every profile found in the packaged tree and the user's config folders."""
    return option_names(GROUP, extra_config_dirs)


def load_profile(
    name: str, overrides: Sequence[str] = (), extra_config_dirs: Sequence[str] = ()
) -> tuple[LauncherProfile | None, list[Problem]]:
    """Load, adjust and check the profile ``name``.

    Args:
        name: the file stem under ``launcher/``.
        overrides: ``launcher.<key>=<value>`` adjustments from the command line.
        extra_config_dirs: user folders (``--config-dir``) searched before the packaged tree.

    Returns:
        ``(profile, [])`` or ``(None, every problem)``, each naming ``launcher.<key>``.

    """
    profile, problems = load_option(GROUP, LauncherProfile, name, overrides, extra_config_dirs)
    if profile is None:
        return None, problems
    # The cross checks still run on the good fields (a bad one falls back to its default), so
    # that one pass reports everything.
    problems += cross_problems(profile)
    return (None, problems) if problems else (profile, [])


def cross_problems(profile: LauncherProfile) -> list[Problem]:
    """Checks across fields, and the partition against ``sinfo`` when SLURM is installed."""
    problems = []
    if profile.gpus_per_node > 0 and not profile.gpu:
        problems.append(
            Problem(
                f"{GROUP}.gpus_per_node",
                f"asks for {profile.gpus_per_node} GPUs of a CPU-only profile (gpu: false)",
                "set launcher.gpus_per_node=0, or pick a GPU profile (launcher=slurm_gpu_8x)",
            )
        )
    if profile.kind == "submitit_slurm" and profile.signal_delay_s >= profile.timeout_min * 60:
        problems.append(
            Problem(
                f"{GROUP}.signal_delay_s",
                f"{profile.signal_delay_s} s is not shorter than the time limit "
                f"({profile.timeout_min} min): the job would be signalled before it starts",
                "give a signal delay well below launcher.timeout_min * 60",
            )
        )
    known = slurm_partitions() if profile.kind == "submitit_slurm" else None
    if known is not None and profile.partition is not None and profile.partition not in known:
        problems.append(
            Problem(
                f"{GROUP}.partition",
                f"no partition {profile.partition!r} on this cluster (sinfo lists "
                f"{', '.join(sorted(known))})",
                "set $SLURM_PARTITION or launcher.partition to one of those",
            )
        )
    elif known is not None and profile.partition is not None:
        problems += _size_problems(profile, known[profile.partition])
    return problems


def submits_elsewhere(profile: LauncherProfile | None) -> bool:
    """Whether the jobs of ``profile`` may run on other hosts (a SLURM or multi-node launcher)."""
    return profile is not None and (profile.kind == "submitit_slurm" or profile.nodes > 1)


def network_store_problems(
    profile: LauncherProfile | None,
    tracking: Any,  # noqa: ANN401 - TrackingConfig or the composed job's DictConfig node
    fs_type: Callable[[Path], str | None] = filesystem_type,
) -> list[Problem]:
    """A sqlite MLflow store on a network filesystem, for jobs that run on other nodes.

    SQLite locks its file with POSIX locks, which NFS, Lustre and GPFS do not reliably honour
    across hosts: jobs writing one store from several nodes can corrupt it. A store given as a
    server URI, or ``tracking.allow_sqlite_on_network_fs=true``, passes.

    Args:
        profile: the launcher profile (``None``: no profile, nothing to check).
        tracking: the job's ``tracking`` config.
        fs_type: path -> filesystem type (:func:`~slca_exp.launch.filesystems.filesystem_type`).

    """
    from slca_exp.tracking.mlflow import store_uri
    from slca_exp.tracking.store import sqlite_file

    backends = [str(b) for b in tracking.backends or []]
    if not submits_elsewhere(profile) or "mlflow" not in backends:
        return []
    db = sqlite_file(store_uri(tracking))
    if db is None or tracking.allow_sqlite_on_network_fs:
        return []
    kind = fs_type(db)
    if kind is None or not is_network(kind):
        return []
    assert profile is not None
    key = "tracking.mlflow_uri" if tracking.mlflow_uri else "tracking.root"
    where = "SLURM jobs" if profile.kind == "submitit_slurm" else f"{profile.nodes} nodes"
    return [
        Problem(
            key,
            f"the MLflow store {db} is a sqlite file on a {kind} filesystem, which {where} "
            "share over the network; SQLite's file locks are not reliable there and concurrent "
            "runs can corrupt the store",
            "log to an MLflow server: tracking.mlflow_uri=http://<host>:5000 (how to start one: "
            "'On a cluster, log to a server' in docs/tracking.md, in the README's map of docs/); "
            "if you know this filesystem's locks work, tracking.allow_sqlite_on_network_fs=true",
        )
    ]


@dataclass(frozen=True)
class NodeSize:
    """The largest node of a partition, as ``sinfo`` reports it (``None``: not reported)."""

    cpus: int | None = None
    mem_mb: int | None = None


def slurm_partitions() -> dict[str, NodeSize] | None:
    """The cluster's partitions and their largest nodes, from ``sinfo``.

    ``None`` when sinfo is absent or fails (no cluster to check against).
    """
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return None
    try:
        res = subprocess.run(
            [sinfo, "-h", "-o", "%R %c %m"], capture_output=True, text=True, timeout=15, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    found: dict[str, NodeSize] = {}
    for line in res.stdout.splitlines():
        name, *sizes = line.split()
        cpus, mem = (_leading_int(v) for v in (*sizes, "", "")[:2])
        seen = found.get(name, NodeSize())
        found[name] = NodeSize(_largest(seen.cpus, cpus), _largest(seen.mem_mb, mem))
    return found


def _size_problems(profile: LauncherProfile, size: NodeSize) -> list[Problem]:
    """A job that no node of its partition can hold, per key (sbatch would refuse it)."""
    problems = []
    cpus = (profile.cpus_per_task or 1) * profile.tasks_per_node
    if size.cpus is not None and cpus > size.cpus:
        problems.append(
            Problem(
                f"{GROUP}.cpus_per_task",
                f"{profile.cpus_per_task or 1} CPUs x {profile.tasks_per_node} tasks per node = "
                f"{cpus} CPUs; the largest node of partition {profile.partition!r} has "
                f"{size.cpus}",
                f"lower launcher.cpus_per_task (or launcher.tasks_per_node) to fit {size.cpus}",
            )
        )
    if (
        size.mem_mb is not None
        and profile.mem_gb is not None
        and profile.mem_gb * 1024 > size.mem_mb
    ):
        problems.append(
            Problem(
                f"{GROUP}.mem_gb",
                f"{profile.mem_gb} GB per node; the largest node of partition "
                f"{profile.partition!r} has {size.mem_mb // 1024} GB",
                f"set launcher.mem_gb to at most {size.mem_mb // 1024}",
            )
        )
    return problems


def _leading_int(text: str) -> int | None:
    digits = ""
    for char in text:
        if not char.isdigit():
            break
        digits += char
    return int(digits) if digits else None


def _largest(a: int | None, b: int | None) -> int | None:
    return max((v for v in (a, b) if v is not None), default=None)


def hydra_overrides(name: str, profile: LauncherProfile) -> list[str]:
    """Register ``profile`` as ``hydra/launcher=slca_<name>`` and return the override to use it."""
    if profile.kind == "basic":
        return []  # Hydra's default launcher
    from hydra.core.config_store import ConfigStore
    from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf

    common = {
        "timeout_min": profile.timeout_min,
        "cpus_per_task": profile.cpus_per_task,
        "gpus_per_node": profile.gpus_per_node or None,
        "tasks_per_node": profile.tasks_per_node,
        "mem_gb": profile.mem_gb,
        "nodes": profile.nodes,
    }
    if profile.kind == "submitit_local":
        node: object = LocalQueueConf(**common)
    else:
        node = SlurmQueueConf(
            **common,
            partition=profile.partition,
            account=profile.account,
            qos=profile.qos,
            setup=list(profile.setup) or None,
            array_parallelism=profile.array_parallelism,
            max_num_timeout=profile.max_num_timeout,
            signal_delay_s=profile.signal_delay_s,
        )
    ConfigStore.instance().store(group="hydra/launcher", name=f"slca_{name}", node=node)
    return [f"hydra/launcher=slca_{name}"]
