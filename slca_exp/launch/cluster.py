"""Ray inside a submitit job: every task boots a Ray node, rank 0 runs the engine.

A submitit job with N tasks (``launcher.nodes`` x ``launcher.tasks_per_node``) runs the same
function in every task (SLURM's ``srun``). :func:`serve` turns those N processes into one Ray
cluster for the engine, which finds it through ``RAY_ADDRESS`` (verl's ``ray.init()`` does):

1. :meth:`TaskInfo.from_env` reads the task's place in the job from SLURM's variables (or those
   of submitit's local executor); it is ``None`` outside a submitit job and in a one-task job,
   where there is nothing to boot, unless the engine runs on Ray: its one-task jobs boot a
   one-node cluster the same way (``one_task``), with the slots the engine asks for
   (:class:`~slca_exp.launch.task.NodeResources`), so that SLURM's signals meet a cluster
   that knows them (below) instead of a Ray the engine would start on its own.
2. Rank 0 starts the head, ``ray start --head --block``, with the ports of :class:`Ports`
   (derived from the job id and the local rank) and a temp dir of its own, and writes the
   head's address into the rendezvous folder (``<submitit folder>/ray-<job id>``, shared by
   every task of the job; ``ray-<job id>.r<n>`` after the n-th requeue).
3. Every other rank waits for that address, joins with ``ray start --address=... --block`` and
   writes ``rank<k>.joined``.
4. Rank 0 waits until the N nodes are alive, runs one small task pinned to each of them (every
   node must execute work), exports ``RAY_ADDRESS``, calls ``main`` with a :class:`ClusterInfo`,
   then writes ``head.done`` (``head.failed`` when anything raised), waits a little for the
   workers to leave and stops its node.
5. A worker that sees ``head.done`` (or ``head.failed``) stops its node, writes ``rank<k>.left``
   and returns ``None``: it exits cleanly when the head is done (and fails after
   :data:`HEAD_LOST_S` when the head vanishes without a word).

Failures: an exception on rank k > 0 is written to ``rank<k>.failed`` (JSON: rank, host, log,
error) before it is re-raised; rank 0 turns the report into a :class:`ClusterError` naming the
rank, its host and its log file, and so does a rank that never joins. :func:`report_failure`
writes the same report for a failure before :func:`serve` (a config check on rank 1).

Authentication: the cluster has a token of its own (Ray's ``RAY_AUTH_MODE=token``), made by
rank 0 and passed to the other ranks in the rendezvous folder (:data:`AUTH_TOKEN`, readable by
the job's user only). Every node, rank 0's driver and what ``main`` starts (verl's ``ray.init()``)
use it; a token another Ray left in ``~/.ray/auth_token`` does not get in the way.

Stopping: each ``ray start`` runs under a supervisor (:mod:`slca_exp.launch.supervise`) that
stops exactly its node's processes when asked or when the task dies; never ``ray stop``, which
stops every Ray node of the host. SIGTERM in the task raises
:class:`~slca_exp.tracking.base.RunKilled`, so the nodes are stopped on the way out. SLURM
signals every process of the job: the nodes' processes do not act on SIGTERM (the task stops
them once its runs are closed: a Ray driver whose raylet is gone exits on the spot) and ignore
the time-limit signal (their processes would die of it), which rank 0 passes to the engine
(:mod:`slca_exp.launch.requeue`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from slca_exp.launch import supervise
from slca_exp.launch.task import (
    ClusterError,
    NodeResources,
    Ports,
    TaskInfo,
    affinity_cpus,
    gpu_share,
    object_store_bytes,
)
from slca_exp.tracking.base import signals_deferred

T = TypeVar("T")

SOCKET_DIR_MAX = 43
"""Longest temp dir Ray's unix sockets fit under: ``<temp dir>/session_<date>_<pid>/sockets/
plasma_store`` adds about 64 characters and the kernel's limit is 107."""

POLL_S = 0.25
START_TIMEOUT_S = 120.0
"""Longest wait for a ``ray start`` to answer (the head's GCS, a worker's node manager)."""
PROBE_TIMEOUT_S = 120.0
"""Longest wait for the probe tasks, one per node."""
LEAVE_TIMEOUT_S = 30.0
"""How long the head waits for the workers to stop their nodes before it stops its own."""
ACK_TIMEOUT_S = 10.0
"""How long a failing worker waits for the head to take its report in before exiting."""
HEAD_LOST_S = 30.0
"""How long a worker tolerates a head whose GCS does not answer before it gives up."""

HEAD_ADDRESS = "head.json"
AUTH_TOKEN = "auth_token"
"""The cluster's token in the rendezvous folder (mode 0600), written before ``head.json`` and
removed when the head's node has stopped."""
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
HEAD_DONE = "head.done"
HEAD_FAILED = "head.failed"


@dataclass(frozen=True)
class NodeInfo:
    """One alive node of the cluster, as Ray lists it and as its probe task saw it."""

    node_id: str
    rank: int | None
    """The task that runs the node (``None`` when it cannot be told)."""
    ip: str
    node_manager_port: int
    temp_dir: str
    hostname: str
    """``socket.gethostname()`` in the probe task that ran on the node."""
    probe_pid: int
    """The process id of the Ray worker that ran the probe task."""
    resources: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterInfo:
    """The cluster that :func:`serve` hands to ``main`` on rank 0."""

    address: str
    """``<ip>:<GCS port>`` of the head, also in ``RAY_ADDRESS`` while ``main`` runs."""
    task: TaskInfo
    nodes: tuple[NodeInfo, ...]
    """Every node, the head's first, then by rank."""


def default_temp_root() -> Path:
    """Where the Ray nodes' temp dirs go: ``/tmp/slca-ray-<uid>`` (short: unix sockets)."""
    return Path("/tmp") / f"slca-ray-{os.getuid()}"


def temp_dir_of(task: TaskInfo, temp_root: str | Path | None = None) -> Path:
    """The temp dir of the Ray node of ``task``: ``<temp root>/<job id>-<rank>``."""
    root = default_temp_root() if temp_root is None else Path(temp_root)
    return root / f"{task.job_id}-{task.rank}"


def report_failure(task: TaskInfo, exc: BaseException) -> None:
    """Tell the other tasks that this one failed, so that rank 0 fails fast with its log path.

    :func:`serve` does it for the failures inside it; call it for a failure before
    :func:`serve` (a config check that fails on rank 1 only). Rank 0's report
    (``head.failed``) makes the workers stop. Never raises: a report that cannot be written is
    only mentioned on stderr.

    Args:
        task: this task.
        exc: what went wrong (its type and message are reported).

    """
    name = HEAD_FAILED if task.rank == 0 else f"rank{task.rank}.failed"
    report = {
        "rank": task.rank,
        "host": task.host,
        "log": task.log,
        "error": f"{type(exc).__name__}: {exc}",
    }
    try:
        task.rendezvous.mkdir(parents=True, exist_ok=True)
        _write_json(task.rendezvous / name, report)
    except OSError as write_error:
        print(f"slca-exp: cannot report the failure of rank {task.rank}: {write_error}",
              file=sys.stderr, flush=True)  # fmt: skip


def serve(
    task: TaskInfo,
    main: Callable[[ClusterInfo], T],
    *,
    join_timeout_s: float = 300.0,
    temp_root: str | Path | None = None,
    resources: NodeResources | None = None,
) -> T | None:
    """Boot this task's Ray node; on rank 0 run ``main`` on the whole cluster, then stop it.

    Args:
        task: this task (:meth:`TaskInfo.from_env`).
        main: what rank 0 runs once every node has joined (it may call ``ray.init()``, which
            joins the cluster through ``RAY_ADDRESS``).
        join_timeout_s: how long rank 0 waits for the other nodes once its own is up (the
            workers wait as long, plus the head's start, for the head).
        temp_root: where the nodes' temp dirs go (:func:`default_temp_root` when ``None``).
        resources: the slots the engine asks of every node (the task's own when ``None``).

    Returns:
        ``main``'s result on rank 0; ``None`` on the other ranks, once the head is done.

    Raises:
        ClusterError: the cluster could not be booted, or another rank failed (the message
            names it, its host and its log file).
        RunKilled: SIGTERM (from :mod:`slca_exp.tracking.base`), after the node is stopped.

    """
    temp_dir = temp_dir_of(task, temp_root)
    resources = NodeResources() if resources is None else resources
    with _sigterm_raises():
        if task.rank == 0:
            return _serve_head(task, main, join_timeout_s, temp_dir, resources)
        _serve_worker(task, join_timeout_s, temp_dir, resources)
        return None


# -- rank 0 ---------------------------------------------------------------------------------


def _serve_head(
    task: TaskInfo,
    main: Callable[[ClusterInfo], T],
    join_timeout_s: float,
    temp_dir: Path,
    resources: NodeResources,
) -> T:
    rendezvous = task.rendezvous
    node: _RayNode | None = None
    previous = {name: os.environ.get(name) for name in ("RAY_ADDRESS", *AUTH_ENV)}
    done = False
    try:
        rendezvous.mkdir(parents=True, exist_ok=True)
        _use_token(_new_token(rendezvous / AUTH_TOKEN))
        import ray
        from ray.util import get_node_ip_address

        ip = get_node_ip_address()
        ports = Ports.for_node(task.job_id, task.local_rank)
        address = f"{ip}:{ports.gcs}"
        node = _RayNode.start(task, ports, ip, temp_dir, head_address=None, resources=resources)
        _wait_until(
            lambda: _tcp_open(ip, ports.gcs),
            START_TIMEOUT_S,
            f"the head's GCS at {address} did not answer within {START_TIMEOUT_S:.0f} s; "
            f"see {task.log}",
            checks=(node.check, lambda: _raise_reported(task)),
        )
        _write_json(rendezvous / HEAD_ADDRESS, {"address": address, "host": task.host})
        handler = signal.getsignal(signal.SIGTERM)
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        try:
            alive = _wait_for_nodes(task, node, join_timeout_s)
            nodes = _probe(task, alive, ip, ports)
        finally:
            ray.shutdown()
            if _in_main_thread() and handler is not None:
                signal.signal(signal.SIGTERM, handler)  # ray.init replaces it
        info = ClusterInfo(address=address, task=task, nodes=nodes)
        print(
            f"slca-exp: Ray cluster up: {len(nodes)}/{task.world_size} nodes (head {address})",
            file=sys.stderr,
            flush=True,
        )
        os.environ["RAY_ADDRESS"] = address
        result = main(info)
        done = True
        return result
    except BaseException as exc:
        report_failure(task, exc)
        failures = _reported_failures(task)
        if failures and not isinstance(exc, ClusterError):
            raise ClusterError(_describe(failures)) from exc
        raise
    finally:
        with signals_deferred():  # stopping the nodes must not be cut
            _disconnect_driver()
            for name, value in previous.items():
                _restore_env(name, value)
            if done:
                _write_json(rendezvous / HEAD_DONE, {"host": task.host})
            if node is not None:
                _wait_for_workers_to_leave(task)
                node.stop(remove_temp_dir=done)
            with contextlib.suppress(OSError):  # the cluster is gone: so is its token
                (rendezvous / AUTH_TOKEN).unlink()


def _new_token(path: Path) -> str:
    """A fresh random token, written to ``path`` readable by this user only."""
    import secrets

    token = secrets.token_hex(32)
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token)
    tmp.replace(path)
    return token


def _use_token(token: str) -> None:
    """Make this process and its children (Ray nodes, drivers) use the cluster's token."""
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = token
    raylet = sys.modules.get("ray._raylet")
    if raylet is not None:
        # Ray reads its settings once, when it is imported (the verl engine's checks import
        # it before the cluster boots): have it read them again, or its driver sends no token.
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()


def _wait_for_nodes(task: TaskInfo, node: _RayNode, join_timeout_s: float) -> list[dict]:
    import ray

    deadline = time.monotonic() + join_timeout_s
    while True:
        _raise_reported(task)
        node.check()
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if len(alive) >= task.world_size:
            return alive
        if time.monotonic() > deadline:
            up = {(n["NodeManagerAddress"], n["NodeManagerPort"]) for n in alive}
            joined = _joined(task)
            missing = [
                k
                for k in range(1, task.world_size)
                if k not in joined or _node_key(joined[k]) not in up
            ]
            detail = ", ".join(f"rank {k} (its log: {task.log_of(k)})" for k in missing)
            raise ClusterError(
                f"only {len(alive)}/{task.world_size} Ray nodes joined within "
                f"{join_timeout_s:g} s; missing: {detail}"
            )
        time.sleep(POLL_S)


def _probe(task: TaskInfo, alive: list[dict], head_ip: str, ports: Ports) -> tuple[NodeInfo, ...]:
    """Run one task pinned to every node; every node must execute work."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, max_retries=0)
    def probe() -> dict[str, Any]:
        import os
        import socket

        import ray

        return {
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    refs = {
        probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(): n
        for n in alive
    }
    pending = list(refs)
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while pending:
        _raise_reported(task)
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
        if pending and time.monotonic() > deadline:
            late = ", ".join(refs[ref]["NodeManagerAddress"] for ref in pending)
            raise ClusterError(
                f"Ray nodes at {late} ran no task within {PROBE_TIMEOUT_S:.0f} s (see {task.log})"
            )
    ranks = {_node_key(j): k for k, j in _joined(task).items()}
    ranks[(head_ip, ports.node_manager)] = 0
    nodes = []
    for ref, n in refs.items():
        seen = ray.get(ref)
        if seen["node_id"] != n["NodeID"]:
            raise ClusterError(f"the probe for node {n['NodeID']} ran on {seen['node_id']}")
        raylet = Path(n.get("RayletSocketName", ""))
        nodes.append(
            NodeInfo(
                node_id=n["NodeID"],
                rank=ranks.get((n["NodeManagerAddress"], n["NodeManagerPort"])),
                ip=n["NodeManagerAddress"],
                node_manager_port=int(n["NodeManagerPort"]),
                temp_dir=str(raylet.parents[2]) if len(raylet.parts) > 3 else "",
                hostname=seen["hostname"],
                probe_pid=int(seen["pid"]),
                resources={k: float(v) for k, v in n.get("Resources", {}).items()},
            )
        )
    return tuple(sorted(nodes, key=lambda n: (n.rank is None, n.rank or 0)))


def _wait_for_workers_to_leave(task: TaskInfo) -> None:
    """Let the workers stop their nodes while the head still answers (a clean unregister)."""
    deadline = time.monotonic() + LEAVE_TIMEOUT_S
    while time.monotonic() < deadline:
        present = _present(task)
        gone = set(_ranks_with(task, "left", present)) | set(_ranks_with(task, "failed", present))
        if set(_ranks_with(task, "joined", present)) <= gone:
            return
        time.sleep(POLL_S)


def _disconnect_driver() -> None:
    """Close a driver connection ``main`` left open: it would outlive the cluster."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        with contextlib.suppress(Exception):
            ray.shutdown()


# -- rank k > 0 -----------------------------------------------------------------------------


def _serve_worker(
    task: TaskInfo, join_timeout_s: float, temp_dir: Path, resources: NodeResources
) -> None:
    rendezvous = task.rendezvous
    node: _RayNode | None = None
    left_cleanly = False
    previous = {name: os.environ.get(name) for name in AUTH_ENV}
    try:
        rendezvous.mkdir(parents=True, exist_ok=True)
        address = _wait_for_head(task, START_TIMEOUT_S + join_timeout_s)
        if address is None:
            return
        head_ip, head_port = address.rsplit(":", 1)
        _use_token((rendezvous / AUTH_TOKEN).read_text().strip())
        _wait_until(
            lambda: _tcp_open(head_ip, int(head_port)),
            START_TIMEOUT_S,
            f"the head's GCS at {address} did not answer within {START_TIMEOUT_S:.0f} s; "
            f"its log: {task.log_of(0)}",
            checks=(lambda: _raise_if_head_failed(task),),
        )
        ports = Ports.for_node(task.job_id, task.local_rank)
        ip = _ip_towards(head_ip)
        node = _RayNode.start(task, ports, ip, temp_dir, head_address=address, resources=resources)
        _wait_until(
            lambda: _tcp_open(ip, ports.node_manager),
            START_TIMEOUT_S,
            f"this node's raylet (port {ports.node_manager}) did not answer within "
            f"{START_TIMEOUT_S:.0f} s",
            checks=(node.check, lambda: _raise_if_head_failed(task)),
        )
        _write_json(
            rendezvous / f"rank{task.rank}.joined",
            {
                "rank": task.rank,
                "host": task.host,
                "ip": ip,
                "node_manager_port": ports.node_manager,
                "log": task.log,
                "temp_dir": str(temp_dir),
            },
        )
        print(f"slca-exp: rank {task.rank} joined the Ray cluster at {address}",
              file=sys.stderr, flush=True)  # fmt: skip
        _wait_for_head_end(task, node, head_ip, int(head_port))
    except _HeadFailed as stop:
        print(f"slca-exp: rank {task.rank} stops: {stop}", file=sys.stderr, flush=True)
        left_cleanly = True
    except BaseException as exc:
        report_failure(task, exc)
        with signals_deferred():  # stopping the nodes must not be cut
            # Give the head time to read the report (srun --kill-on-bad-exit would stop it).
            _wait_until(
                lambda: bool(_present(task) & {HEAD_FAILED, HEAD_DONE}),
                ACK_TIMEOUT_S,
                "",
                quiet=True,
            )
        raise
    finally:
        with signals_deferred():  # stopping the nodes must not be cut
            if node is not None:
                node.stop(remove_temp_dir=left_cleanly)
                with contextlib.suppress(OSError):
                    _write_json(rendezvous / f"rank{task.rank}.left", {"host": task.host})
            for name, value in previous.items():
                _restore_env(name, value)


class _HeadFailed(Exception):
    """The head is done, or reported a failure: the worker leaves without failing itself."""


def _raise_if_head_failed(task: TaskInfo) -> None:
    present = _present(task)
    if HEAD_FAILED in present:
        report = _read_json(task.rendezvous / HEAD_FAILED) or {}
        raise _HeadFailed(f"the head failed: {report.get('error', '?')}")
    if HEAD_DONE in present:
        raise _HeadFailed("the head is done")


def _wait_for_head(task: TaskInfo, timeout_s: float) -> str | None:
    """The head's address from the rendezvous folder; ``None`` if the head ended first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _raise_if_head_failed(task)
        except _HeadFailed as stop:
            print(f"slca-exp: rank {task.rank} stops: {stop}", file=sys.stderr, flush=True)
            return None
        head = _read_json(task.rendezvous / HEAD_ADDRESS)
        if head is not None and head.get("address"):
            return str(head["address"])
        if time.monotonic() > deadline:
            raise ClusterError(
                f"the head (rank 0 on {task.head_host}) did not start Ray within "
                f"{timeout_s:g} s; its log: {task.log_of(0)}"
            )
        time.sleep(POLL_S)


def _wait_for_head_end(task: TaskInfo, node: _RayNode, head_ip: str, head_port: int) -> None:
    """Raise :class:`_HeadFailed` once the head is done; ClusterError if it vanishes."""
    lost_since: float | None = None
    while True:
        _raise_if_head_failed(task)  # _HeadFailed: the head is done, or failed
        node.check()
        if _tcp_open(head_ip, head_port):
            lost_since = None
        elif lost_since is None:
            lost_since = time.monotonic()
        elif time.monotonic() - lost_since > HEAD_LOST_S:
            raise ClusterError(
                f"the head's GCS at {head_ip}:{head_port} stopped answering for "
                f"{HEAD_LOST_S:.0f} s without reporting; its log: {task.log_of(0)}"
            )
        time.sleep(POLL_S)


# -- reports --------------------------------------------------------------------------------


def _present(task: TaskInfo) -> set[str]:
    """The names in the rendezvous folder (a listing: fresher than a lookup on NFS)."""
    try:
        return set(os.listdir(task.rendezvous))
    except OSError:
        return set()


def _ranks_with(task: TaskInfo, suffix: str, present: set[str] | None = None) -> list[int]:
    """The ranks k > 0 that left ``rank<k>.<suffix>``."""
    present = _present(task) if present is None else present
    return [k for k in range(1, task.world_size) if f"rank{k}.{suffix}" in present]


def _joined(task: TaskInfo) -> dict[int, dict]:
    found = {}
    for k in _ranks_with(task, "joined"):
        report = _read_json(task.rendezvous / f"rank{k}.joined")
        if report is not None:
            found[k] = report
    return found


def _node_key(joined: Mapping[str, Any]) -> tuple[Any, Any]:
    """(ip, node manager port) of a ``rank<k>.joined`` report, as ``ray.nodes()`` has them."""
    return joined.get("ip"), joined.get("node_manager_port")


def _reported_failures(task: TaskInfo) -> list[dict]:
    found = []
    for k in _ranks_with(task, "failed"):
        report = _read_json(task.rendezvous / f"rank{k}.failed")
        found.append(report if report is not None else {"rank": k, "log": task.log_of(k)})
    return found


def _describe(failures: Sequence[Mapping[str, Any]]) -> str:
    return "; ".join(
        f"rank {f.get('rank', '?')} on {f.get('host', '?')} failed: {f.get('error', '?')}; "
        f"its log: {f.get('log', '?')}"
        for f in failures
    )


def _raise_reported(task: TaskInfo) -> None:
    failures = _reported_failures(task)
    if failures:
        raise ClusterError(_describe(failures))


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` whole or not at all (readers on other hosts poll the folder)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else {}


# -- one Ray node ---------------------------------------------------------------------------


class _RayNode:
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
    ) -> _RayNode:
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
                + " (another Ray node on this host holds this job's port block)"
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


def _tcp_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _ip_towards(peer: str) -> str:
    """The address of this host on the route to ``peer`` (the head), like Ray's own guess."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((peer, 1))
            return str(sock.getsockname()[0])
    except OSError:
        from ray.util import get_node_ip_address

        return str(get_node_ip_address())


def _wait_until(
    ready: Callable[[], bool],
    timeout_s: float,
    message: str,
    checks: Sequence[Callable[[], None]] = (),
    *,
    quiet: bool = False,
) -> None:
    """Poll ``ready``; run ``checks`` (which raise) first; ClusterError(message) at timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        for check in checks:
            check()
        if ready():
            return
        if time.monotonic() > deadline:
            if quiet:
                return
            raise ClusterError(message)
        time.sleep(POLL_S)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`~slca_exp.tracking.base.RunKilled` (main thread only).

    The handler waits for an open ``signals_deferred`` block (stopping the nodes).
    """
    if not _in_main_thread():
        yield
        return
    from slca_exp.tracking.base import RunKilled, deferrable

    @deferrable
    def handler(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the nodes be stopped
        raise RunKilled(f"received signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
