"""The rendezvous of a submitit job's tasks: files in a folder every task of the job shares.

    <submitit folder>/ray-<job id>[.r<n>]       (:attr:`TaskInfo.rendezvous`; ``.r<n>`` after
                                                 the n-th requeue)
      auth_token        rank 0: the cluster's token (mode 0600), written first, removed when
                        the head's node has stopped
      head.json         rank 0: the head's address, once its GCS answers
      rank<k>.joined    rank k: its node is up (ip, node manager port, log, temp dir)
      head.done         rank 0: ``main`` returned; the workers stop their nodes
      rank<k>.left      rank k: its node is stopped
      rank<k>.failed    rank k: what went wrong (JSON: rank, host, log, error)
      head.failed       rank 0: the same; the workers stop

Every file is written whole or not at all (:func:`write_json`: readers on other hosts poll the
folder) and read by listing the folder (fresher than a lookup on NFS). The orchestration that
writes and waits for them is :mod:`slca_exp.launch.cluster`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slca_exp.core.task import ClusterError, TaskInfo

POLL_S = 0.25
"""How often the rendezvous folder (and a node, a port) is looked at while waiting."""

HEAD_ADDRESS = "head.json"
AUTH_TOKEN = "auth_token"
"""The cluster's token in the rendezvous folder (mode 0600), written before ``head.json`` and
removed when the head's node has stopped."""
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
HEAD_DONE = "head.done"
HEAD_FAILED = "head.failed"


def report_failure(task: TaskInfo, exc: BaseException) -> None:
    """Tell the other tasks that this one failed, so that rank 0 fails fast with its log path.

    :func:`slca_exp.launch.cluster.serve` does it for the failures inside it; call it for a
    failure before ``serve`` (a config check that fails on rank 1 only). Rank 0's report
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
        write_json(task.rendezvous / name, report)
    except OSError as write_error:
        print(f"slca-exp: cannot report the failure of rank {task.rank}: {write_error}",
              file=sys.stderr, flush=True)  # fmt: skip


# -- waiting --------------------------------------------------------------------------------


def wait_until(
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


def wait_for_workers_to_leave(task: TaskInfo, timeout_s: float) -> None:
    """Let the workers stop their nodes while the head still answers (a clean unregister)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        present = present_names(task)
        gone = set(ranks_with(task, "left", present)) | set(ranks_with(task, "failed", present))
        if set(ranks_with(task, "joined", present)) <= gone:
            return
        time.sleep(POLL_S)


# -- the cluster's token -------------------------------------------------------------------


def new_token(path: Path) -> str:
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


def use_token(token: str) -> None:
    """Make this process and its children (Ray nodes, drivers) use the cluster's token."""
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = token
    raylet = sys.modules.get("ray._raylet")
    if raylet is not None:
        # Ray reads its settings once, when it is imported (the verl engine's checks import
        # it before the cluster boots): have it read them again, or its driver sends no token.
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()


# -- a worker waiting on the head ----------------------------------------------------------


class HeadFailed(Exception):
    """The head is done, or reported a failure: the worker leaves without failing itself."""


def raise_if_head_failed(task: TaskInfo) -> None:
    """Raise :class:`HeadFailed` once the head reported it is done or failed."""
    present = present_names(task)
    if HEAD_FAILED in present:
        report = read_json(task.rendezvous / HEAD_FAILED) or {}
        raise HeadFailed(f"the head failed: {report.get('error', '?')}")
    if HEAD_DONE in present:
        raise HeadFailed("the head is done")


def wait_for_head(task: TaskInfo, timeout_s: float) -> str | None:
    """The head's address from the rendezvous folder; ``None`` if the head ended first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            raise_if_head_failed(task)
        except HeadFailed as stop:
            print(f"slca-exp: rank {task.rank} stops: {stop}", file=sys.stderr, flush=True)
            return None
        head = read_json(task.rendezvous / HEAD_ADDRESS)
        if head is not None and head.get("address"):
            return str(head["address"])
        if time.monotonic() > deadline:
            raise ClusterError(
                f"the head (rank 0 on {task.head_host}) did not start Ray within "
                f"{timeout_s:g} s; its log: {task.log_of(0)}"
            )
        time.sleep(POLL_S)


# -- reports --------------------------------------------------------------------------------


def present_names(task: TaskInfo) -> set[str]:
    """The names in the rendezvous folder (a listing: fresher than a lookup on NFS)."""
    try:
        return set(os.listdir(task.rendezvous))
    except OSError:
        return set()


def ranks_with(task: TaskInfo, suffix: str, present: set[str] | None = None) -> list[int]:
    """The ranks k > 0 that left ``rank<k>.<suffix>``."""
    present = present_names(task) if present is None else present
    return [k for k in range(1, task.world_size) if f"rank{k}.{suffix}" in present]


def joined_reports(task: TaskInfo) -> dict[int, dict]:
    """Rank k > 0 -> its ``rank<k>.joined`` report, for every rank that wrote one."""
    found = {}
    for k in ranks_with(task, "joined"):
        report = read_json(task.rendezvous / f"rank{k}.joined")
        if report is not None:
            found[k] = report
    return found


def node_key(joined: Mapping[str, Any]) -> tuple[Any, Any]:
    """(ip, node manager port) of a ``rank<k>.joined`` report, as ``ray.nodes()`` has them."""
    return joined.get("ip"), joined.get("node_manager_port")


def reported_failures(task: TaskInfo) -> list[dict]:
    """The ``rank<k>.failed`` reports of the ranks k > 0 (rank and log when unreadable)."""
    found = []
    for k in ranks_with(task, "failed"):
        report = read_json(task.rendezvous / f"rank{k}.failed")
        found.append(report if report is not None else {"rank": k, "log": task.log_of(k)})
    return found


def describe_failures(failures: Sequence[Mapping[str, Any]]) -> str:
    """One line naming each failed rank, its host, its error and its log."""
    return "; ".join(
        f"rank {f.get('rank', '?')} on {f.get('host', '?')} failed: {f.get('error', '?')}; "
        f"its log: {f.get('log', '?')}"
        for f in failures
    )


def raise_reported(task: TaskInfo) -> None:
    """Raise a :class:`ClusterError` describing the failures other ranks reported, if any."""
    failures = reported_failures(task)
    if failures:
        raise ClusterError(describe_failures(failures))


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` whole or not at all (readers on other hosts poll the folder)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    """A report's content; ``None`` when it is not there or not readable yet."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else {}
