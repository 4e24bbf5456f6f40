"""Time limits and preemption on SLURM: checkpoint, requeue, continue the same run.

SLURM sends the preemption signal (USR2, ``signal_delay_s`` before the time limit; submitit asks
for it with ``--signal``) to every task of the job. submitit's own handler on rank 0 pickles the
job again and runs ``scontrol requeue`` at once, from wherever the main thread happens to be:
the engine gets no chance to save its state. :func:`preemption_requeues` puts the engine first:

    signal -> RunPreempted raised in the main thread (held back while a step is being recorded,
    see ``signals_deferred``) -> the engine checkpoints and re-raises -> the trackers close the
    run KILLED -> submitit's handler requeues the job (its ``max_num_timeout`` countdown applies)

The requeued job runs the same command in the same folder; the engine finds its checkpoint and
the MLflow run it was logging to (``resume_ids``) and continues at the next step. SLURM may send
the signal before the engine has started (its time-limit check runs every 30 s): the run's ids
are noted as soon as it opens (``remember_run_ids``), so the requeued job still continues it.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from slca_exp.tracking.base import RunPreempted, deferrable, global_rank, preempt_signal

Handler = Callable[[int, FrameType | None], Any]


def submitit_handler(signum: int) -> Handler | None:
    """The checkpoint-and-requeue handler submitit installed for ``signum``, if it is in place."""
    if os.environ.get("SUBMITIT_EXECUTOR", "") == "":
        return None
    current = signal.getsignal(signum)
    owner = getattr(current, "__self__", None)
    if getattr(current, "__name__", "") != "checkpoint_and_try_requeue" or owner is None:
        return None
    return current


@contextmanager
def preemption_requeues(checkpointable: bool) -> Iterator[bool]:
    """Route SLURM's preemption signal through the run, then let submitit requeue the job.

    Args:
        checkpointable: the engine saves its state on :class:`RunPreempted` and resumes from it;
            otherwise submitit's handling is left as it is.

    Yields:
        whether preemption is routed through the run (rank 0 of a submitit job, checkpointable).

    """
    signum = preempt_signal()
    requeue = submitit_handler(signum) if checkpointable and global_rank() == 0 else None
    if requeue is None:
        yield False
        return

    @deferrable
    def _raise_preempted(received: int, frame: FrameType | None) -> None:
        signal.signal(received, signal.SIG_IGN)  # one checkpoint; more signals change nothing
        raise RunPreempted(f"received signal {signal.Signals(received).name}")

    signal.signal(signum, _raise_preempted)
    try:
        yield True
    except RunPreempted:
        print(
            "slca-exp: time limit or preemption announced; state checkpointed, requeueing "
            "the job (it continues the same run)",
            file=sys.stderr,
            flush=True,
        )
        requeue(signum, None)  # submitit: requeue (or refuse, past max_num_timeout) and exit
        raise
    finally:
        signal.signal(signum, requeue)  # submitit's again, for whatever runs after the task
