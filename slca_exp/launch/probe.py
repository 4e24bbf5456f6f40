"""The head's check of a job's Ray cluster: every node joined, and every node runs work.

:func:`wait_for_nodes` waits until Ray lists one alive node per task (naming the ranks that never
joined); :func:`probe_nodes` then runs one task pinned to each node and describes them as
:class:`NodeInfo`, with the rank that runs each. Rank 0 of :mod:`slca_exp.launch.cluster` calls
both, connected to the cluster as a driver.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slca_exp.core.task import ClusterError, Ports, TaskInfo
from slca_exp.launch.ray_node import RayNode
from slca_exp.launch.rendezvous import POLL_S, joined_reports, node_key, raise_reported

PROBE_TIMEOUT_S = 120.0
"""Longest wait for the probe tasks, one per node."""


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


def wait_for_nodes(task: TaskInfo, node: RayNode, join_timeout_s: float) -> list[dict]:
    """The alive nodes, once there is one per task; ClusterError naming those that never joined."""
    import ray

    deadline = time.monotonic() + join_timeout_s
    while True:
        raise_reported(task)
        node.check()
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if len(alive) >= task.world_size:
            return alive
        if time.monotonic() > deadline:
            up = {(n["NodeManagerAddress"], n["NodeManagerPort"]) for n in alive}
            joined = joined_reports(task)
            missing = [
                k
                for k in range(1, task.world_size)
                if k not in joined or node_key(joined[k]) not in up
            ]
            detail = ", ".join(f"rank {k} (its log: {task.log_of(k)})" for k in missing)
            raise ClusterError(
                f"only {len(alive)}/{task.world_size} Ray nodes joined within "
                f"{join_timeout_s:g} s; missing: {detail}"
            )
        time.sleep(POLL_S)


def probe_nodes(
    task: TaskInfo, alive: list[dict], head_ip: str, ports: Ports
) -> tuple[NodeInfo, ...]:
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
        raise_reported(task)
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
        if pending and time.monotonic() > deadline:
            late = ", ".join(refs[ref]["NodeManagerAddress"] for ref in pending)
            raise ClusterError(
                f"Ray nodes at {late} ran no task within {PROBE_TIMEOUT_S:.0f} s (see {task.log})"
            )
    ranks = {node_key(j): k for k, j in joined_reports(task).items()}
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
