"""One Ray node of a submitit job's task: ``ray start --block`` under its supervisor.

    task (TaskInfo), its ports (Ports), its ip, its temp dir
    free_ports(task)     the task's port block, or its next free one when another node holds it
      -> RayNode.start   checks (temp dir short enough for Ray's sockets, the ports free on this
                         host), then ``python -m slca_exp.launch.supervise <temp dir> ray start
                         --block ...`` with the task's CPUs, GPUs and object store, the head's
                         or a worker's flags
      -> node.check()    raises once ``ray start --block`` has exited
      -> node.stop()     the supervisor stops exactly this node's processes (never
                         ``ray stop``, which stops every Ray node of the host); whatever is
                         left is killed

The network helpers the cluster's rendezvous needs (:func:`tcp_open`, :func:`ip_towards`) and
where the nodes' temp dirs go (:func:`temp_dir_of`) live here too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from filelock import FileLock

from slca_exp.core.task import (
    PORT_SLOTS,
    ClusterError,
    NodeResources,
    Ports,
    TaskInfo,
    affinity_cpus,
    gpu_share,
    object_store_bytes,
)
from slca_exp.launch import supervise

SOCKET_DIR_MAX = 43
"""Longest temp dir Ray's unix sockets fit under: ``<temp dir>/session_<date>_<pid>/sockets/
plasma_store`` adds about 64 characters and the kernel's limit is 107."""


def default_temp_root() -> Path:
    """Where the Ray nodes' temp dirs go: ``/tmp/slca-ray-<uid>`` (short: unix sockets)."""
    return Path("/tmp") / f"slca-ray-{os.getuid()}"


def temp_dir_of(task: TaskInfo, temp_root: str | Path | None = None) -> Path:
    """The temp dir of the Ray node of ``task``: ``<temp root>/<job id>-<rank>``."""
    root = default_temp_root() if temp_root is None else Path(temp_root)
    return root / f"{task.job_id}-{task.rank}"


class RayNode:
    """A ``ray start --block`` under its supervisor (:mod:`slca_exp.launch.supervise`)."""

    def __init__(self, proc: subprocess.Popen, temp_dir: Path, what: str, log: str) -> None:
        self.proc = proc
        self.temp_dir = temp_dir
        self.what = what
        self.log = log

    @classmethod
    def start(
        cls,
        task: TaskInfo,
        ports: Ports,
        ip: str,
        temp_dir: Path,
        *,
        head_address: str | None,
        resources: NodeResources | None = None,
    ) -> RayNode:
        """Start the task's node: the head when ``head_address`` is ``None``, else a worker.

        Raises:
            ClusterError: the temp dir is too long for Ray's sockets, or a port of the node is
                in use on this host.

        """
        head = head_address is None
        resources = NodeResources() if resources is None else resources
        if len(str(temp_dir)) > SOCKET_DIR_MAX:
            raise ClusterError(
                f"the Ray temp dir {temp_dir} is longer than {SOCKET_DIR_MAX} characters: "
                "Ray's unix socket paths would not fit (pass a shorter temp_root)"
            )
        busy = _busy_ports(ports.fixed(head=head))
        if busy:
            raise ClusterError(
                f"ports of this task's Ray node are in use on {task.host}: "
                + ", ".join(f"{p} ({name})" for name, p in busy.items())
                + " (other Ray nodes on this host hold this task's port blocks)"
            )
        temp_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--block",
            f"--node-ip-address={ip}",
            f"--temp-dir={temp_dir}",
            f"--num-cpus={max(task.cpus or affinity_cpus(), resources.num_cpus or 0)}",
            "--disable-usage-stats",
            "--log-style=record",
            "--log-color=false",
            *ports.ray_start_args(head=head),
        ]
        cmd += ["--head", "--include-dashboard=false"] if head else [f"--address={head_address}"]
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        # Ray 2.60 drains a node for up to 30 s on SIGTERM; nothing is served here.
        env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        env[supervise.NODE_MARKER] = str(temp_dir)  # inherited by every process of the node
        num_gpus, visible = gpu_share(os.environ, task.tasks_per_node, task.local_rank)
        if resources.num_gpus is not None:
            num_gpus = resources.num_gpus
        if num_gpus is not None:
            cmd.append(f"--num-gpus={num_gpus}")
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        store = object_store_bytes(task.mem_mb)
        if store is not None:
            cmd.append(f"--object-store-memory={store}")
        what = "the head's `ray start`" if head else f"rank {task.rank}'s `ray start`"
        proc = subprocess.Popen(
            [sys.executable, "-m", supervise.__name__, str(temp_dir), *cmd],
            stdin=subprocess.DEVNULL,
            stdout=2,  # this task's log (srun --error), even when sys.stderr is replaced
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=supervise.die_with_parent(),
        )
        return cls(proc, temp_dir, what, task.log)

    def check(self) -> None:
        """Raise if the node has stopped (``ray start --block`` exited)."""
        code = self.proc.poll()
        if code is not None:
            raise ClusterError(f"{self.what} exited with status {code}; see {self.log}")

    def stop(self, *, remove_temp_dir: bool = False) -> None:
        """Have the supervisor stop the node; SIGKILL whatever is left after a while."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(supervise.STOP_SIGNAL)
        try:
            self.proc.wait(timeout=supervise.STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            supervise.signal_group(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        supervise.kill_node_processes(self.temp_dir, exclude=())
        if remove_temp_dir:
            import shutil

            shutil.rmtree(self.temp_dir, ignore_errors=True)


PORTS_LOCK = Path(tempfile.gettempdir()) / f"slca-exp-ray-ports-{os.getuid()}.lock"
"""The host's lock around choosing a Ray node's ports and binding them (:func:`ports_choice`);
one per user, since another user's lock file in the shared temp folder is not ours to open."""


@contextlib.contextmanager
def ports_choice() -> Iterator[None]:
    """Hold this host's lock while a node picks its ports (:func:`free_ports`) and binds them.

    Without it, two nodes starting at once on one host can both find the same block free.
    """
    with FileLock(PORTS_LOCK):
        yield


def free_ports(task: TaskInfo, *, head: bool) -> Ports:
    """The task's port block, or the first free one of its candidates when another node holds it.

    The candidates of local rank ``r`` are its own slot shifted by multiples of the host's task
    count, so the tasks of one job never pick the same block. When every candidate is taken the
    task's own block is returned, and :meth:`RayNode.start` names the ports in use.
    """
    step = max(1, task.tasks_per_node)
    for shift in range(0, PORT_SLOTS, step):
        ports = Ports.for_node(task.job_id, task.local_rank, shift)
        if not _busy_ports(ports.fixed(head=head)):
            return ports
    return Ports.for_node(task.job_id, task.local_rank)


def _busy_ports(named: Mapping[str, int]) -> dict[str, int]:
    busy = {}
    for name, port in named.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("", port))
            except OSError:
                busy[name] = port
    return busy


def tcp_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts a TCP connection at ``host:port`` (a GCS, a raylet)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def ip_towards(peer: str) -> str:
    """The address of this host on the route to ``peer`` (the head), like Ray's own guess."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((peer, 1))
            return str(sock.getsockname()[0])
    except OSError:
        from ray.util import get_node_ip_address

        return str(get_node_ip_address())
