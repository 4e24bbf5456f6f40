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

An engine whose training runs in other processes (verl's trainer, a Ray actor) cannot be
stopped by an exception in this one: :func:`preemption_stops` hands it the signal instead,

    signal -> request() (the engine asks its trainer to stop at the next step boundary, after
    a checkpoint) -> the trainer stops -> the engine raises RunPreempted -> as above
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

from slca_exp.core.process import RunPreempted, deferrable, global_rank, preempt_signal

Handler = Callable[[int, FrameType | None], Any]


class _Routing:
    """Whether an open :func:`preemption_requeues` block routes the signal through the run."""

    depth = 0


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
    _Routing.depth += 1
    try:
        yield True
    except RunPreempted:
        print(
            "slca-exp: time limit or preemption announced; state checkpointed, requeueing "
            "the job (it continues the same run)",
            file=sys.stderr,
            flush=True,
        )
        # SLURM stops a job as soon as it is requeued (SIGTERM to every process): that SIGTERM
        # is the requeue under way, not a cancellation, and must not end the job as killed
        # (submitit would record that as the job's result instead of waiting for the requeue).
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            requeue(signum, None)  # submitit: requeue and exit, or refuse past max_num_timeout
        except SystemExit:
            raise  # requeued: the job exits
        except BaseException:
            signal.signal(signal.SIGTERM, previous)  # not requeued: SIGTERM kills the job again
            raise
        raise
    finally:
        _Routing.depth -= 1
        signal.signal(signum, requeue)  # submitit's again, for whatever runs after the task


@dataclass
class StopRequest:
    """What :func:`preemption_stops` saw: whether the preemption signal asked for a stop."""

    signal: int | None = None
    """The signal that asked (``None``: none did)."""

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for while the block ran."""
        return self.signal is not None


@contextmanager
def preemption_stops(request: Callable[[], None]) -> Iterator[StopRequest]:
    """While the block runs, the preemption signal calls ``request`` instead of raising.

    For an engine whose training runs elsewhere (a Ray actor): ``request`` asks it to stop at
    its next step boundary, once a checkpoint covers every step it logged; the block keeps
    waiting for it, then the engine raises :class:`RunPreempted` itself if it did stop, and
    :func:`preemption_requeues` requeues the job. A signal after a training that finished
    anyway changes nothing. Outside :func:`preemption_requeues` (no SLURM, rank k > 0, an
    engine that does not checkpoint) the signal's handling is left as it is and nothing is
    ever requested.

    Args:
        request: called once, in the main thread, when the signal arrives (keep it short: a
            file written, a flag set).

    Yields:
        The :class:`StopRequest`, ``requested`` once the signal came.

    """
    stop = StopRequest()
    if _Routing.depth == 0 or threading.current_thread() is not threading.main_thread():
        yield stop
        return
    signum = preempt_signal()

    @deferrable
    def _ask_to_stop(received: int, frame: FrameType | None) -> None:
        signal.signal(received, signal.SIG_IGN)  # one request; more signals change nothing
        stop.signal = received
        print(
            f"slca-exp: {signal.Signals(received).name}: time limit or preemption announced; "
            "the trainer stops at its next step boundary, after a checkpoint",
            file=sys.stderr,
            flush=True,
        )
        request()

    previous = signal.signal(signum, _ask_to_stop)
    try:
        yield stop
    finally:
        signal.signal(signum, previous)
