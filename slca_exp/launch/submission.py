"""A sweep submitted through submitit: where each job is, said at once; scheduler noise, once.

hydra-submitit-launcher submits the sweep's jobs (one SLURM array job), then waits for their
results without saying which jobs it submitted. The sweep callback (``launch/sweep.py``)
starts two helpers in the launching process before the jobs are submitted, whatever way the
launcher was chosen (``launcher=`` profile or ``hydra/launcher=``):

- :class:`SubmissionWatch`: submitit gives each job a folder named after its id
  (``<sweep dir>/.submitit/<id>``, with ``<id>_submitted.pkl``) as soon as the job is submitted;
  the watch says one line per job: its SLURM job id (``<array id>_<index>``, or the process id
  of a local job) and its log file (submitit's ``<id>_0_log.out``);
- :func:`quiet_sacct`: submitit polls ``sacct`` while it waits. On a cluster without
  accounting each poll fails: ``sacct`` writes its own complaint ("Slurm accounting storage is
  disabled") to the terminal it inherits, and submitit warns that the call failed, each warning
  printed by three handlers (24 lines for a 1-minute job). ``sacct``'s stderr is captured
  instead, and the first failure is said once, in our words with ``sacct``'s reason. Job states
  then come from ``squeue -t all``, which keeps a job's final state for a while after it ended,
  in ``sacct``'s format; where squeue cannot answer either, from submitit's own files (each job
  writes its result there, but an array element cancelled before it started never does, and
  submitit would wait for it forever).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from slca_exp.core.shown import shown_path

SACCT_WARNING = "Bypassing sacct error"
"""What submitit's warning says when ``sacct`` fails (``submitit/core/core.py``)."""
GONE = "GONE"
"""The state of a job squeue no longer lists (it ended; submitit found no result from it)."""
ENDED_STATES = frozenset(
    {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
     "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
)  # fmt: skip
"""squeue states of a job that has ended."""
ENDED_GRACE_S = 60.0
"""How long an ended state squeue shows is held back: time for the job to write its result."""
MAX_ARRAY_INDEX = 1000
"""The highest array index SLURM gives by default (``MaxArraySize`` 1001)."""
POLL_S = 0.5
"""How often :class:`SubmissionWatch` looks for new job folders."""


class _SacctCaptured:
    """``subprocess`` as submitit's core module sees it: ``sacct``'s stderr captured.

    submitit's watcher runs ``subprocess.check_output(["sacct", ...])``, which leaves the
    child's stderr on the terminal; only that call changes (its stderr is kept in
    :attr:`reason`), every other name is the real module's.
    """

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.said = False
        self.ended: dict[str, float] = {}  # job id -> when squeue first showed it ended
        self.reason = ""
        """What the last failed ``sacct`` call wrote to stderr (or why it could not run)."""

    def __getattr__(self, name: str) -> Any:  # whatever the subprocess module holds
        return getattr(self.module, name)

    def check_output(self, command: Sequence[str] | str, *args: Any, **kwargs: Any) -> Any:
        """``subprocess.check_output``; for ``sacct`` (without a stderr of its own) quietly."""
        if not _is_sacct(command) or "stderr" in kwargs:
            return self.module.check_output(command, *args, **kwargs)
        try:
            return self.module.check_output(command, *args, stderr=subprocess.PIPE, **kwargs)
        except subprocess.CalledProcessError as err:
            said = err.stderr
            if isinstance(said, bytes):
                said = said.decode(errors="replace")
            self.reason = " ".join((said or "").split()) or f"exit status {err.returncode}"
            failed: Exception = err
        except OSError as err:
            self.reason = err.strerror or type(err).__name__
            failed = err
        states = self._from_squeue(command)
        if states is None:
            raise failed
        if not self.said:
            self.said = True
            print(
                "slca-exp: submitit cannot ask SLURM's accounting (its sacct call failed: "
                f"{self.reason}); job states are read from squeue instead (said once)",
                file=sys.stderr,
                flush=True,
            )
        return states

    def _settled(self, row: str) -> str:
        """``row`` (``id|state|nodes``), an ended state held back for :data:`ENDED_GRACE_S`.

        A job cancelled while it runs shows CANCELLED at once, while its process is still
        closing its run and writing the result submitit reads; until the grace is over it is
        reported as COMPLETING, which submitit keeps waiting on.
        """
        job, state, *rest = row.split("|")
        word = state.split()[0] if state.strip() else ""
        if word not in ENDED_STATES:
            return row
        first = self.ended.setdefault(job, time.monotonic())
        if time.monotonic() - first >= ENDED_GRACE_S:
            return row
        return "|".join([job, "COMPLETING", *rest])

    def _from_squeue(self, command: Sequence[str] | str) -> bytes | None:
        """What ``sacct`` would have answered for the jobs ``command`` asks about, from squeue.

        ``squeue -r -t all`` lists every waiting or running job (each array element on its own
        line) and keeps an ended one for a while (SLURM's ``MinJobAge``, 5 minutes by default)
        with its final state. A job it does not list has ended: its state is then
        :data:`GONE`. submitit asks only about jobs that left no result file, and without an
        answer it would wait forever for one that never will, as an array element cancelled
        before it started (SLURM forgets those at once). ``None`` when squeue cannot answer.
        """
        words = command.split() if isinstance(command, str) else [str(w) for w in command]
        arrays = {words[i + 1] for i, w in enumerate(words[:-1]) if w == "-j"}
        try:
            found = self.module.run(
                ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%N"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if found.returncode != 0:
            return None
        rows = [
            self._settled(x)
            for x in found.stdout.splitlines()
            if x.split("|")[0].split("_")[0] in arrays
        ]
        # Every job asked about, and every element of its array, is gone unless listed (later
        # lines win in submitit's reading): SLURM's largest array has MAX_ARRAY_INDEX + 1.
        gone = [f"{a}|{GONE}|" for a in sorted(arrays)]
        gone += [f"{a}_[0-{MAX_ARRAY_INDEX}]|{GONE}|" for a in sorted(arrays)]
        return "\n".join(["JobID|State|NodeList", *gone, *rows, ""]).encode()


def _is_sacct(command: Sequence[str] | str) -> bool:
    words = command.split() if isinstance(command, str) else list(command)
    return bool(words) and Path(str(words[0])).name == "sacct"


class _SacctOnce(logging.Filter):
    """Drops submitit's repeated ``sacct`` warning; the first becomes one line of ours."""

    def __init__(self, captured: _SacctCaptured | None = None) -> None:
        super().__init__()
        self.seen = 0
        self.captured = captured

    def filter(self, record: logging.LogRecord) -> bool:
        if SACCT_WARNING not in record.getMessage():
            return True
        self.seen += 1
        if self.seen == 1:
            reason = self.captured.reason if self.captured is not None else ""
            print(
                "slca-exp: submitit cannot ask SLURM's accounting (its sacct call failed"
                + (f": {reason}" if reason else "")
                + "); job states are read from submitit's own files instead (said once)",
                file=sys.stderr,
                flush=True,
            )
        return False


def quiet_sacct() -> logging.Filter:
    """Keep ``sacct``'s complaints off the console, once per process; returns the log filter.

    ``sacct``'s stderr is captured in submitit's watcher, and the filter on submitit's logger
    turns its repeated warning into one line of ours.
    """
    import submitit.core.core as core

    if not isinstance(core.subprocess, _SacctCaptured):
        core.subprocess = _SacctCaptured(core.subprocess)
    logger = logging.getLogger("submitit")
    for existing in logger.filters:
        if isinstance(existing, _SacctOnce):
            return existing
    found = _SacctOnce(core.subprocess)
    logger.addFilter(found)
    return found


def submitted_jobs(folder: Path) -> list[str]:
    """Ids of the jobs submitted into submitit's ``folder``, in submission order.

    A job's folder holds its ``<id>_submitted.pkl``; an array's own folder (``<array id>``,
    with the sbatch script) holds none. Array elements sort by index.
    """
    if not folder.is_dir():
        return []
    ids = [p.name for p in folder.iterdir() if (p / f"{p.name}_submitted.pkl").is_file()]
    return sorted(ids, key=lambda i: [int(part) if part.isdigit() else 0 for part in i.split("_")])


def job_line(job_id: str, folder: Path, kind: str) -> str:
    """``slca-exp: submitted SLURM job 12_0, log: <folder>/12_0/12_0_0_log.out``.

    The log is named relative to the current folder when it lies under it (as the closing
    block names it).

    >>> job_line("12_0", Path("/s/.submitit"), "SLURM job")
    'slca-exp: submitted SLURM job 12_0, log: /s/.submitit/12_0/12_0_0_log.out'
    """
    log = shown_path(folder / job_id / f"{job_id}_0_log.out")
    return f"slca-exp: submitted {kind} {job_id}, log: {log}"


class SubmissionWatch:
    """Says each job submitit submits into ``folder``, once, as soon as its folder appears.

    Args:
        folder: submitit's folder of the sweep (``<sweep dir>/.submitit``).
        kind: what a job is called: ``SLURM job`` or ``local job``.

    """

    def __init__(self, folder: Path, kind: str) -> None:
        self.folder = folder
        self.kind = kind
        self.said: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slca-submission", daemon=True)

    def start(self) -> SubmissionWatch:
        """Start watching (a daemon thread)."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching, after saying the jobs not said yet (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.say_new()

    def say_new(self) -> None:
        """Say the jobs whose folders appeared since the last look."""
        for job_id in submitted_jobs(self.folder):
            if job_id not in self.said:
                self.said.append(job_id)
                print(job_line(job_id, self.folder, self.kind), file=sys.stderr, flush=True)

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.say_new()
