"""The supervisor of one Ray node, and how to find and stop every process of that node.

``slca_exp.launch.cluster`` starts each ``ray start --block`` as
``python -m slca_exp.launch.supervise <temp dir> <ray start command...>``, the leader of a
session of its own (:func:`supervise`). The supervisor gets SIGTERM when its task dies (Linux
``PR_SET_PDEATHSIG``, :func:`die_with_parent`) and then stops exactly its node: its process
group, then the processes marked with :data:`NODE_MARKER` that left it. Never ``ray stop``: it
stops every Ray node of the host, the other ranks' and other users'.
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

STOP_GRACE_S = 15.0
"""SIGTERM to a node's process group, then SIGKILL after this many seconds."""


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
    ``slca_exp.launch.cluster`` as the leader of a new session. SIGTERM, SIGINT or the death of
    the task (``PR_SET_PDEATHSIG``, or a new parent) stops the node: SIGTERM to the whole group
    (the processes Ray starts stay in it), SIGKILL after :data:`STOP_GRACE_S`, then the
    node's processes that left the group. Also stops the rest of the node when ``ray start``
    exits by itself, with its status.
    """
    temp_dir, cmd = argv[0], list(argv[1:])
    parent = os.getppid()
    asked: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        asked.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    child = subprocess.Popen(cmd)
    while child.poll() is None and not asked and os.getppid() == parent:
        time.sleep(0.1)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    me = os.getpid()
    group = os.getpgrp()
    # The GCS last: the other processes report to it on their way out (the raylet unregisters,
    # the autoscaler's monitor posts an error) and would wait for it for seconds.
    last = {child.pid, me} | {p for p in _group_members(group) if _cmdline_has(p, b"gcs_server")}
    for pid in _group_members(group):
        if pid not in last:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
    _wait_for_group(group, keep=last, timeout_s=STOP_GRACE_S / 2)
    signal_group(group, signal.SIGTERM)  # ignored by this process
    _wait_for_group(group, keep={me}, timeout_s=STOP_GRACE_S / 2)
    for pid in _group_members(group):
        if pid != me:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    kill_node_processes(temp_dir, exclude=(me,))
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=5)
    return 0 if asked else (child.returncode or 0)


def _wait_for_group(group: int, keep: set[int], timeout_s: float) -> None:
    """Wait until the live processes of ``group`` are all in ``keep`` (at most ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and set(_group_members(group)) - keep:
        time.sleep(0.05)


def _cmdline_has(pid: int, text: bytes) -> bool:
    try:
        return text in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child get SIGTERM when this process dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl
            os.kill(os.getpid(), signal.SIGTERM)

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
