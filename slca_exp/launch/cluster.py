"""Ray inside a submitit job: every task boots a Ray node, rank 0 runs the engine.

A submitit job with N tasks (``launcher.nodes`` x ``launcher.tasks_per_node``) runs the same
function in every task (SLURM's ``srun``). :func:`serve` turns those N processes into one Ray
cluster for the engine, which finds it through ``RAY_ADDRESS`` (verl's ``ray.init()`` does):

1. :meth:`TaskInfo.from_env` reads the task's place in the job from SLURM's variables (or those
   of submitit's local executor); it is ``None`` outside a submitit job and in a one-task job,
   where there is nothing to boot, unless the engine runs on Ray: its one-task jobs boot a
   one-node cluster the same way (``one_task``), with the slots the engine asks for
   (:class:`~slca_exp.core.task.NodeResources`), so that SLURM's signals meet a cluster
   that knows them (below) instead of a Ray the engine would start on its own.
2. Rank 0 starts the head (``ray start --head --block``, ``ray_node.py``) with the ports of
   :class:`Ports` (from the job id and the local rank) and a temp dir of its own, and writes its
   address into the rendezvous folder (``rendezvous.py``: ``<submitit folder>/ray-<job id>``,
   shared by the job's tasks; ``ray-<job id>.r<n>`` after the n-th requeue).
3. Every other rank waits for that address, joins with ``ray start --address=... --block`` and
   writes ``rank<k>.joined``.
4. Rank 0 waits until the N nodes are alive, runs one small task pinned to each of them (every
   node must execute work, ``probe.py``), exports ``RAY_ADDRESS``, calls ``main`` with a
   :class:`ClusterInfo`, then writes ``head.done`` (``head.failed`` when anything raised), waits
   a little for the workers to leave and stops its node.
5. A worker that sees ``head.done`` (or ``head.failed``) stops its node, writes ``rank<k>.left``
   and returns ``None``: it exits cleanly when the head is done (and fails after
   :data:`HEAD_LOST_S` when the head vanishes without a word).

Failures: an exception on rank k > 0 is written to ``rank<k>.failed`` (JSON: rank, host, log,
error) before it is re-raised; rank 0 turns the report into a :class:`ClusterError` naming the
rank, its host and its log file, and so does a rank that never joins.
:func:`~slca_exp.launch.rendezvous.report_failure` writes the same report for a failure before
:func:`serve` (a config check on rank 1).

Authentication: the cluster has a token of its own (Ray's ``RAY_AUTH_MODE=token``), made by
rank 0 and passed to the other ranks in the rendezvous folder (``auth_token``, readable by
the job's user only). Every node, rank 0's driver and what ``main`` starts (verl's ``ray.init()``)
use it; a token another Ray left in ``~/.ray/auth_token`` does not get in the way.

Stopping: each ``ray start`` runs under a supervisor (:mod:`slca_exp.launch.supervise`) that
stops exactly its node's processes when asked or when the task dies; never ``ray stop``, which
stops every Ray node of the host. SIGTERM in the task raises
:class:`~slca_exp.core.process.RunKilled`, so the nodes are stopped on the way out. SLURM
signals every process of the job: the nodes' processes do not act on SIGTERM (the task stops
them once its runs are closed: a Ray driver whose raylet is gone exits on the spot) and ignore
the time-limit signal (their processes would die of it), which rank 0 passes to the engine
(:mod:`slca_exp.core.preemption`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from slca_exp.core.process import RunKilled, deferrable, signals_deferred
from slca_exp.core.task import ClusterError, NodeResources, TaskInfo
from slca_exp.launch.probe import NodeInfo, probe_nodes, wait_for_nodes
from slca_exp.launch.ray_node import (
    RayNode,
    free_ports,
    ip_towards,
    ports_choice,
    tcp_open,
    temp_dir_of,
)
from slca_exp.launch.rendezvous import (
    AUTH_ENV,
    AUTH_TOKEN,
    HEAD_ADDRESS,
    HEAD_DONE,
    HEAD_FAILED,
    POLL_S,
    HeadFailed,
    describe_failures,
    new_token,
    present_names,
    raise_if_head_failed,
    raise_reported,
    report_failure,
    reported_failures,
    use_token,
    wait_for_head,
    wait_for_workers_to_leave,
    wait_until,
    write_json,
)

T = TypeVar("T")

START_TIMEOUT_S = 120.0
"""Longest wait for a ``ray start`` to answer (the head's GCS, a worker's node manager)."""
LEAVE_TIMEOUT_S = 30.0
"""How long the head waits for the workers to stop their nodes before it stops its own."""
ACK_TIMEOUT_S = 10.0
"""How long a failing worker waits for the head to take its report in before exiting."""
HEAD_LOST_S = 30.0
"""How long a worker tolerates a head whose GCS does not answer before it gives up."""


@dataclass(frozen=True)
class ClusterInfo:
    """The cluster that :func:`serve` hands to ``main`` on rank 0."""

    address: str
    """``<ip>:<GCS port>`` of the head, also in ``RAY_ADDRESS`` while ``main`` runs."""
    task: TaskInfo
    nodes: tuple[NodeInfo, ...]
    """Every node, the head's first, then by rank."""


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
        RunKilled: SIGTERM (from :mod:`slca_exp.core.process`), after the node is stopped.

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
    node: RayNode | None = None
    previous = {name: os.environ.get(name) for name in ("RAY_ADDRESS", *AUTH_ENV)}
    done = False
    try:
        rendezvous.mkdir(parents=True, exist_ok=True)
        use_token(new_token(rendezvous / AUTH_TOKEN))
        import ray
        from ray.util import get_node_ip_address

        ip = get_node_ip_address()
        # One Ray node of this host picks its ports and binds them at a time: two starting
        # together would otherwise both find the same block free.
        with ports_choice():
            ports = free_ports(task, head=True)
            address = f"{ip}:{ports.gcs}"
            node = RayNode.start(task, ports, ip, temp_dir, head_address=None, resources=resources)
            wait_until(
                lambda: tcp_open(ip, ports.gcs),
                START_TIMEOUT_S,
                f"the head's GCS at {address} did not answer within {START_TIMEOUT_S:.0f} s; "
                f"see {task.log}",
                checks=(node.check, lambda: raise_reported(task)),
            )
        write_json(rendezvous / HEAD_ADDRESS, {"address": address, "host": task.host})
        handler = signal.getsignal(signal.SIGTERM)
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        try:
            alive = wait_for_nodes(task, node, join_timeout_s)
            nodes = probe_nodes(task, alive, ip, ports)
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
        failures = reported_failures(task)
        if failures and not isinstance(exc, ClusterError):
            raise ClusterError(describe_failures(failures)) from exc
        raise
    finally:
        with signals_deferred():  # stopping the nodes must not be cut
            _disconnect_driver()
            for name, value in previous.items():
                _restore_env(name, value)
            if done:
                write_json(rendezvous / HEAD_DONE, {"host": task.host})
            if node is not None:
                wait_for_workers_to_leave(task, LEAVE_TIMEOUT_S)
                node.stop(remove_temp_dir=done)
            with contextlib.suppress(OSError):  # the cluster is gone: so is its token
                (rendezvous / AUTH_TOKEN).unlink()


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
    node: RayNode | None = None
    left_cleanly = False
    previous = {name: os.environ.get(name) for name in AUTH_ENV}
    try:
        rendezvous.mkdir(parents=True, exist_ok=True)
        address = wait_for_head(task, START_TIMEOUT_S + join_timeout_s)
        if address is None:
            return
        head_ip, head_port = address.rsplit(":", 1)
        use_token((rendezvous / AUTH_TOKEN).read_text().strip())
        wait_until(
            lambda: tcp_open(head_ip, int(head_port)),
            START_TIMEOUT_S,
            f"the head's GCS at {address} did not answer within {START_TIMEOUT_S:.0f} s; "
            f"its log: {task.log_of(0)}",
            checks=(lambda: raise_if_head_failed(task),),
        )
        ip = ip_towards(head_ip)
        with ports_choice():  # as the head's
            ports = free_ports(task, head=False)
            node = RayNode.start(
                task, ports, ip, temp_dir, head_address=address, resources=resources
            )
            wait_until(
                lambda: tcp_open(ip, ports.node_manager),
                START_TIMEOUT_S,
                f"this node's raylet (port {ports.node_manager}) did not answer within "
                f"{START_TIMEOUT_S:.0f} s",
                checks=(node.check, lambda: raise_if_head_failed(task)),
            )
        write_json(
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
    except HeadFailed as stop:
        print(f"slca-exp: rank {task.rank} stops: {stop}", file=sys.stderr, flush=True)
        left_cleanly = True
    except BaseException as exc:
        report_failure(task, exc)
        with signals_deferred():  # stopping the nodes must not be cut
            # Give the head time to read the report (srun --kill-on-bad-exit would stop it).
            wait_until(
                lambda: bool(present_names(task) & {HEAD_FAILED, HEAD_DONE}),
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
                    write_json(rendezvous / f"rank{task.rank}.left", {"host": task.host})
            for name, value in previous.items():
                _restore_env(name, value)


def _wait_for_head_end(task: TaskInfo, node: RayNode, head_ip: str, head_port: int) -> None:
    """Raise :class:`HeadFailed` once the head is done; ClusterError if it vanishes."""
    lost_since: float | None = None
    while True:
        raise_if_head_failed(task)  # HeadFailed: the head is done, or failed
        node.check()
        if tcp_open(head_ip, head_port):
            lost_since = None
        elif lost_since is None:
            lost_since = time.monotonic()
        elif time.monotonic() - lost_since > HEAD_LOST_S:
            raise ClusterError(
                f"the head's GCS at {head_ip}:{head_port} stopped answering for "
                f"{HEAD_LOST_S:.0f} s without reporting; its log: {task.log_of(0)}"
            )
        time.sleep(POLL_S)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`~slca_exp.core.process.RunKilled` (main thread only).

    The handler waits for an open ``signals_deferred`` block (stopping the nodes).
    """
    if not _in_main_thread():
        yield
        return

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
