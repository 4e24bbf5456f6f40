"""The supervisor of one Ray node, and how to find and stop every process of that node.

``slca_exp.launch.cluster`` starts each ``ray start --block`` as
``python -m slca_exp.launch.supervise <temp dir> <ray start command...>``, the leader of a
session of its own (:func:`supervise`). The supervisor gets :data:`STOP_SIGNAL` when its task
asks or dies (Linux ``PR_SET_PDEATHSIG``, :func:`die_with_parent`) and then stops exactly its
node: its process group, then the processes marked with :data:`NODE_MARKER` that left it. Never
``ray stop``: it stops every Ray node of the host, the other ranks' and other users'.

SLURM signals every process of a job, not only the task's: the node's processes must outlive
the signals until the task has closed its runs.

- SIGTERM (``scancel``, a requeue, the end of the job): Ray's processes would stop at once, and
  a Ray driver whose local raylet is gone exits on the spot (the task's own process, verl's
  driver: its runs would stay RUNNING). The node's processes start with SIGTERM blocked (a
  blocked signal stays blocked across ``fork`` and ``exec``); the task stops the node once its
  runs are closed, and the supervisor itself after :data:`TERM_GRACE_S` at the latest.
- The time-limit signal (submitit's, USR2 by default): its default action ends a process; the
  supervisor and the node's processes ignore it. The task's rank 0 acts on it for the job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

STOP_SIGNAL = signal.SIGHUP
"""What stops a supervisor's node: sent by its task (``slca_exp.launch.cluster``), or by the
kernel when the task dies (:func:`die_with_parent`). SIGINT does too."""
STOP_TIMEOUT_S = 10.0
"""How long a task waits for its supervisor to stop the node before it kills what is left."""
TERM_GRACE_S = 20.0
"""After SIGTERM, how long the supervisor waits for its task to stop the node (having closed
its runs) before it stops it itself: under SLURM's ``KillWait`` (30 s by default), after which
SLURM kills every process of the job."""


NODE_MARKER = "SLCA_RAY_NODE"
"""Environment variable that every process of a node inherits: its temp dir. Ray renames its
processes (``ray::DashboardAgent``), so the command line alone does not find them all."""


def node_processes(temp_dir: str | Path) -> list[int]:
    """The live processes of the Ray node whose temp dir is ``temp_dir``.

    Found by :data:`NODE_MARKER` in their environment or by ``temp_dir`` in their command line
    (only the processes of this user can be read). Empty once the node is stopped.
    """
    exact = str(temp_dir).encode()
    inside = exact + b"/"
    marker = NODE_MARKER.encode() + b"=" + exact
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if _proc_state(entry) in ("Z", "X", None):
                continue
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if not any(a == exact or a.endswith(b"=" + exact) or inside in a for a in args):
                environ = (entry / "environ").read_bytes().split(b"\0")
                if marker not in environ:
                    continue
        except OSError:
            continue
        found.append(int(entry.name))
    return found


def kill_node_processes(temp_dir: str | Path, exclude: Sequence[int]) -> None:
    """SIGKILL every live process of the node of ``temp_dir`` but those in ``exclude``."""
    for pid in node_processes(temp_dir):
        if pid not in exclude:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def supervise(argv: Sequence[str]) -> int:
    """Run ``ray start --block`` and stop every process of its node when asked or orphaned.

    ``python -m slca_exp.launch.supervise <temp dir> <ray start command...>``, started by
    ``slca_exp.launch.cluster`` as the leader of a new session. :data:`STOP_SIGNAL` (or SIGINT)
    or the death of the task (``PR_SET_PDEATHSIG``, or a new parent) stops the node at once;
    SIGTERM stops it after :data:`TERM_GRACE_S` unless the task stops it first. Stopping is
    SIGKILL to the whole group (the processes Ray starts stay in it; SIGTERM is blocked in
    them), then to the node's processes that left the group. Also stops the rest of the node
    when ``ray start`` exits by itself, with its status.
    """
    temp_dir, cmd = argv[0], list(argv[1:])
    parent = os.getppid()
    asked: list[int] = []
    terminated: list[float] = []

    def on_stop(signum: int, frame: object) -> None:
        asked.append(signum)

    def on_term(signum: int, frame: object) -> None:
        terminated.append(time.monotonic())

    handled = (STOP_SIGNAL, signal.SIGINT, signal.SIGTERM)
    signal.signal(STOP_SIGNAL, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGTERM, on_term)
    ignore_time_limit_signal(keep=handled)  # before Popen: the node's processes inherit it
    child = subprocess.Popen(cmd, preexec_fn=_block_sigterm)
    while child.poll() is None and not asked and os.getppid() == parent:
        if terminated and time.monotonic() - terminated[0] > TERM_GRACE_S:
            break
        time.sleep(0.1)
    for sig in handled:
        signal.signal(sig, signal.SIG_IGN)
    me = os.getpid()
    for pid in _group_members(os.getpgrp()):
        if pid != me:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    kill_node_processes(temp_dir, exclude=(me,))
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=5)
    return 0 if asked or terminated else (child.returncode or 0)


def _block_sigterm() -> None:
    """A ``preexec_fn``: the node's processes never act on SIGTERM (they inherit the mask)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def ignore_time_limit_signal(keep: tuple[signal.Signals, ...] = ()) -> signal.Signals | None:
    """Ignore SLURM's time-limit signal in this process and in what it starts from now on.

    An ignored signal stays ignored across ``exec``: Ray's processes (raylet, GCS, workers)
    install no handler for it and would otherwise die of it.

    Args:
        keep: signals this process handles itself; left alone if the time-limit signal is one
            of them (``SUBMITIT_PREEMPT_SIGNAL=TERM``).

    Returns:
        The signal now ignored, or ``None``.

    """
    from slca_exp.core.process import preempt_signal

    signum = preempt_signal()
    if signum in keep:
        return None
    signal.signal(signum, signal.SIG_IGN)
    return signum


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child get :data:`STOP_SIGNAL` when this process dies."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(STOP_SIGNAL))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl
            os.kill(os.getpid(), STOP_SIGNAL)

    return preexec


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to process group ``pgid`` (nothing when it is gone or not ours)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _proc_state(entry: Path) -> str | None:
    """The state letter of ``/proc/<pid>`` (``Z``: zombie); ``None`` when it is gone."""
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return None
    rest = stat[stat.rfind(")") + 2 :].split()
    return rest[0] if rest else None


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) > 2 and rest[0] not in ("Z", "X") and int(rest[2]) == pgid:
            members.append(int(entry.name))
    return members


if __name__ == "__main__":
    sys.exit(supervise(sys.argv[1:]))
