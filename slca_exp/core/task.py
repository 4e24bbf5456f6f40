"""One task of a submitit job: its place in the job, its Ray ports, its resources.

:meth:`TaskInfo.from_env` reads what SLURM (or submitit's local executor) tells the task:
rank, local rank, hosts, the shared submitit folder and its log file, CPUs and memory.
:class:`Ports` derives the ports of the task's Ray node from the job id alone, so every task
knows the head's address port without asking. The resource helpers size the task's Ray node
(CPUs, object store, its share of the host's GPUs), and :class:`NodeResources` is what an
engine adds to them. :mod:`slca_exp.launch.cluster` boots the cluster from these.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

PORT_RANGE = (20000, 32000)
"""Ports of the Ray nodes, ``[low, high)``: under Linux's ephemeral range (32768-60999), so no
outgoing connection of the host holds one of them by chance."""
PORT_BLOCK = 500
"""Ports per Ray node: the fixed ports (GCS, node manager, ...) then the worker ports."""
WORKER_PORTS_OFFSET = 20
"""Where the worker ports start in a node's block (the rest of the block is theirs)."""
PORT_SLOTS = (PORT_RANGE[1] - PORT_RANGE[0]) // PORT_BLOCK
"""Blocks in :data:`PORT_RANGE`: also the most tasks of one job on one host."""


_ENV_NAMES: dict[str, dict[str, str]] = {
    # submitit.slurm.slurm.SlurmJobEnvironment._env
    "slurm": {
        "job_id": "SLURM_JOB_ID",
        "array_job_id": "SLURM_ARRAY_JOB_ID",
        "array_task_id": "SLURM_ARRAY_TASK_ID",
        "num_tasks": "SLURM_NTASKS",
        "num_nodes": "SLURM_JOB_NUM_NODES",
        "global_rank": "SLURM_PROCID",
        "local_rank": "SLURM_LOCALID",
    },
    # submitit.local.local.LocalJobEnvironment._env
    "local": {
        "job_id": "SUBMITIT_LOCAL_JOB_ID",
        "num_tasks": "SUBMITIT_LOCAL_NTASKS",
        "num_nodes": "SUBMITIT_LOCAL_JOB_NUM_NODES",
        "global_rank": "SUBMITIT_LOCAL_GLOBALID",
        "local_rank": "SUBMITIT_LOCAL_LOCALID",
    },
}


class ClusterError(RuntimeError):
    """The Ray cluster of a job could not be booted, or one of its tasks failed."""


@dataclass(frozen=True)
class TaskInfo:
    """One task of a multi-task submitit job: its place in the job and its resources."""

    job_id: str
    """submitit's job id: ``<SLURM_JOB_ID>``, or ``<array job id>_<array task id>``."""
    rank: int
    """Global rank (``SLURM_PROCID``); rank 0 runs the head and the engine."""
    local_rank: int
    """Rank among the tasks of this host (``SLURM_LOCALID``); picks the port block."""
    world_size: int
    """Tasks in the job, hence Ray nodes in the cluster."""
    num_nodes: int
    """Hosts in the job."""
    tasks_per_node: int
    """Tasks on this host (they share its GPUs and its memory)."""
    head_host: str
    """The first host of the job (where rank 0 runs)."""
    host: str
    """This host."""
    folder: Path
    """The submitit job folder (shared by every task; the logs are there)."""
    rendezvous: Path
    """Where the tasks leave their reports: ``<folder>/ray-<job id>`` (``.r<n>`` after the
    n-th requeue of the job)."""
    log: str
    """This task's log file (submitit's ``<job id>_<rank>_log.err``, or ``.out``)."""
    cpus: int | None = None
    """CPUs of this task (``SLURM_CPUS_PER_TASK``), when known."""
    mem_mb: int | None = None
    """Memory of this task in MB (``SLURM_MEM_PER_NODE`` / tasks on the host, or
    ``SLURM_MEM_PER_CPU`` x cpus), when known."""

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, one_task: bool = False
    ) -> TaskInfo | None:
        """Read the task from submitit's and SLURM's environment variables.

        Args:
            environ: the variables; ``os.environ`` when ``None``.
            one_task: also read the task of a one-task job: an engine that runs on Ray
                (:class:`NodeResources`) gets the job's own Ray node there too, instead of a
                Ray of its own that knows nothing of SLURM's signals.

        Returns:
            The task, or ``None`` outside a submitit job (no ``SUBMITIT_EXECUTOR`` of
            ``slurm`` or ``local``) and, unless ``one_task``, in a one-task job (there is no
            cluster to boot).

        Raises:
            ClusterError: a multi-task job without ``SUBMITIT_FOLDER`` (no shared folder to meet
                in), or with a rank that does not parse.

        """
        env = os.environ if environ is None else environ
        executor = env.get("SUBMITIT_EXECUTOR", "")
        names = _ENV_NAMES.get(executor)
        if names is None or not env.get(names["job_id"]):
            return None
        try:
            world_size = env_int(env, names["num_tasks"]) or 1
            if world_size <= 1 and not one_task:
                return None
            rank = env_int(env, names["global_rank"]) or 0
            local_rank = env_int(env, names["local_rank"]) or 0
            num_nodes = env_int(env, names["num_nodes"]) or 1
        except ValueError as exc:
            raise ClusterError(f"cannot read this task's place in the job: {exc}") from None
        job_id = env[names["job_id"]]
        array_job = env.get(names.get("array_job_id", ""), "")
        array_task = env.get(names.get("array_task_id", ""), "")
        if array_job and array_task:
            job_id = f"{array_job}_{array_task}"
        raw_folder = env.get("SUBMITIT_FOLDER", "")
        if not raw_folder:
            raise ClusterError(
                f"task {rank} of a {world_size}-task job has no SUBMITIT_FOLDER: the tasks "
                "cannot meet to boot Ray (run the job through submitit)"
            )
        from submitit.core.utils import JobPaths

        folder = JobPaths(raw_folder, job_id=job_id).folder
        restart = env_int(env, "SLURM_RESTART_COUNT", lenient=True) or 0
        hosts = _hosts(env) if executor == "slurm" else []
        host = env.get("SLURMD_NODENAME") or socket.gethostname()
        tasks_per_node = _tasks_per_node(env, world_size, num_nodes)
        cpus = env_int(env, "SLURM_CPUS_PER_TASK", lenient=True)
        mem_mb = _mem_per_task_mb(env, tasks_per_node, cpus)
        return cls(
            job_id=job_id,
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            num_nodes=num_nodes,
            tasks_per_node=tasks_per_node,
            head_host=hosts[0] if hosts else host,
            host=host,
            folder=folder,
            rendezvous=folder / f"ray-{job_id}{f'.r{restart}' if restart else ''}",
            log=log_path(folder, job_id, rank),
            cpus=cpus,
            mem_mb=mem_mb,
        )

    def log_of(self, rank: int) -> str:
        """The log file of task ``rank`` of this job (see :func:`log_path`)."""
        return log_path(self.folder, self.job_id, rank)


@dataclass(frozen=True)
class NodeResources:
    """What an engine asks of every Ray node of its job (the engine's ``ray_node(config)``).

    ``None`` leaves a resource as the task has it: its CPUs, its share of the host's GPUs.
    """

    num_cpus: int | None = None
    """CPU slots the node declares at least (logical ones when the engine's actors mostly
    wait, as verl's do on the cpu backend); more when the task has more CPUs."""
    num_gpus: int | None = None
    """GPU slots the node declares (logical ones on a CPU host: verl's resource pools ask Ray
    for GPUs only); ``None``: the task's share of the host's GPUs (:func:`gpu_share`)."""


@dataclass(frozen=True)
class Ports:
    """The ports of one Ray node, a block of :data:`PORT_BLOCK` derived from the job id.

    The block of local rank ``r`` is slot ``(h + r) % PORT_SLOTS`` of :data:`PORT_RANGE`, where
    ``h`` is a hash of the job id: the tasks of one job on one host get distinct blocks. Two
    jobs on one host may hash to one block; a task whose block another Ray node holds takes
    the next free one of its own (``shift``: a multiple of the host's tasks, so the job's tasks
    still never share one), and the workers learn the head's address from the rendezvous.
    """

    gcs: int
    node_manager: int
    object_manager: int
    dashboard: int
    dashboard_agent_grpc: int
    dashboard_agent_listen: int
    metrics_export: int
    runtime_env_agent: int
    ray_client_server: int
    min_worker: int
    max_worker: int

    @classmethod
    def for_node(cls, job_id: str, local_rank: int = 0, shift: int = 0) -> Ports:
        """The ports of the Ray node of task ``local_rank`` (on its host) of job ``job_id``.

        Args:
            job_id: the job's id.
            local_rank: the task's rank on its host.
            shift: slots past the task's own (the next candidates when its block is taken).

        Raises:
            ValueError: ``local_rank`` is negative or not under :data:`PORT_SLOTS`.

        """
        if not 0 <= local_rank < PORT_SLOTS:
            raise ValueError(f"local rank {local_rank} is outside 0..{PORT_SLOTS - 1}")
        digest = hashlib.sha256(str(job_id).encode()).digest()
        slot = (int.from_bytes(digest[:8], "big") + local_rank + shift) % PORT_SLOTS
        base = PORT_RANGE[0] + slot * PORT_BLOCK
        return cls(
            gcs=base,
            node_manager=base + 1,
            object_manager=base + 2,
            dashboard=base + 3,
            dashboard_agent_grpc=base + 4,
            dashboard_agent_listen=base + 5,
            metrics_export=base + 6,
            runtime_env_agent=base + 7,
            ray_client_server=base + 8,
            min_worker=base + WORKER_PORTS_OFFSET,
            max_worker=base + PORT_BLOCK - 1,
        )

    @classmethod
    def head_gcs_port(cls, job_id: str) -> int:
        """The head's GCS port, which every task of the job derives from the job id."""
        return cls.for_node(job_id, 0).gcs

    def fixed(self, *, head: bool) -> dict[str, int]:
        """Name -> port of the single ports a node listens on (GCS, dashboard: head only)."""
        named = {f.name: getattr(self, f.name) for f in fields(self)}
        del named["min_worker"], named["max_worker"]
        if not head:
            for name in ("gcs", "dashboard", "ray_client_server"):
                del named[name]
        return named

    def ray_start_args(self, *, head: bool) -> list[str]:
        """The ``ray start`` options that pin a node's ports."""
        args = [
            f"--node-manager-port={self.node_manager}",
            f"--object-manager-port={self.object_manager}",
            f"--dashboard-agent-grpc-port={self.dashboard_agent_grpc}",
            f"--dashboard-agent-listen-port={self.dashboard_agent_listen}",
            f"--metrics-export-port={self.metrics_export}",
            f"--runtime-env-agent-port={self.runtime_env_agent}",
            f"--min-worker-port={self.min_worker}",
            f"--max-worker-port={self.max_worker}",
        ]
        if head:
            args += [
                f"--port={self.gcs}",
                f"--dashboard-port={self.dashboard}",
                f"--ray-client-server-port={self.ray_client_server}",
            ]
        return args


def log_path(folder: str | Path, job_id: str, rank: int) -> str:
    """The log file of task ``rank``: submitit's ``<job id>_<rank>_log.err``.

    The ``.out`` file when only it exists (``stderr_to_stdout``); the ``.err`` path when neither
    exists yet.
    """
    from submitit.core.utils import JobPaths

    paths = JobPaths(folder, job_id=job_id, task_id=rank)
    if paths.stderr.exists() or not paths.stdout.exists():
        return str(paths.stderr)
    return str(paths.stdout)


# -- resources ------------------------------------------------------------------------------


def env_int(env: Mapping[str, str], name: str, *, lenient: bool = False) -> int | None:
    """``int(env[name])``; ``None`` when unset (or, with ``lenient``, when it does not parse)."""
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        if lenient:
            return None
        raise ValueError(f"{name}={value!r} is not an integer") from None


def _hosts(env: Mapping[str, str]) -> list[str]:
    """The expanded ``SLURM_JOB_NODELIST`` (submitit's parser)."""
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        return []
    try:
        from submitit.slurm.slurm import _parse_node_list

        return list(_parse_node_list(nodelist))
    except Exception:  # a private helper of submitit: fall back to the first name
        return [nodelist.split(",")[0].split("[")[0]]


def _tasks_per_node(env: Mapping[str, str], world_size: int, num_nodes: int) -> int:
    for name in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        # SLURM_TASKS_PER_NODE reads like "2(x3),1": the first host's count
        value = env.get(name, "").split(",")[0].split("(")[0].strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return max(1, math.ceil(world_size / max(1, num_nodes)))


def _mem_per_task_mb(env: Mapping[str, str], tasks_per_node: int, cpus: int | None) -> int | None:
    per_node = env_int(env, "SLURM_MEM_PER_NODE", lenient=True)
    if per_node:
        return per_node // max(1, tasks_per_node)
    per_cpu = env_int(env, "SLURM_MEM_PER_CPU", lenient=True)
    if per_cpu:
        return per_cpu * (cpus or 1)
    return None


def affinity_cpus() -> int:
    """CPUs this process may run on (its affinity mask; the host's count where unknown)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:
        return os.cpu_count() or 1


def object_store_bytes(mem_mb: int | None) -> int | None:
    """30% of the task's memory, within [80 MB, 200 GB]; ``None`` (Ray's default) if unknown."""
    if not mem_mb:
        return None
    mb = min(max(int(mem_mb * 0.3), 80), 200 * 1024)
    return mb * 1024 * 1024


def gpu_share(
    env: Mapping[str, str], tasks_per_node: int, local_rank: int
) -> tuple[int | None, str | None]:
    """The GPUs of this task's Ray node: (``--num-gpus``, ``CUDA_VISIBLE_DEVICES`` for it).

    ``(None, None)`` when nothing says (Ray detects them). When the tasks of a host all see
    the same devices (``CUDA_VISIBLE_DEVICES`` lists ``SLURM_GPUS_ON_NODE`` of them, or the
    local executor's shared list), each task's node gets an equal share, so that two nodes of
    a host never hand out the same GPU.
    """
    on_node = env_int(env, "SLURM_GPUS_ON_NODE", lenient=True)
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        if on_node is None:
            return None, None
        ids = [str(i) for i in range(on_node)]
    else:
        ids = [d.strip() for d in raw.split(",") if d.strip() and d.strip() != "NoDevFiles"]
    shared = on_node is None or len(ids) == on_node
    if tasks_per_node > 1 and ids and shared and len(ids) % tasks_per_node == 0:
        size = len(ids) // tasks_per_node
        ids = ids[local_rank * size : (local_rank + 1) * size]
        return len(ids), ",".join(ids)
    return len(ids), None
