"""Ranks, stop signals and the exceptions a stopped run raises.

A run is stopped by SIGTERM (``scancel``, a supervisor, Ctrl-C's sibling) or, on SLURM, by the
signal that announces a time limit or a preemption. The handlers raise :class:`RunKilled` /
:class:`RunPreempted` in the main thread, where the tracker closes the run KILLED and an engine
that checkpoints saves its state; :func:`signals_deferred` holds them back for work that must
not be cut (a store transaction, a step's update, its metrics and its checkpoint).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

RANK_ENV_VARS = ("RANK", "SLURM_PROCID", "SUBMITIT_LOCAL_GLOBAL_RANK")
"""Where the global rank is read from, first set wins: torchrun/Ray, SLURM (also submitit's
SLURM executor), submitit's local executor."""

EXIT_KILLED = 128 + signal.SIGTERM
"""The exit status of a run stopped by SIGTERM (the shell convention)."""


def global_rank(environ: Mapping[str, str] | None = None) -> int:
    """The process's global rank (0 when no launcher set one)."""
    environ = os.environ if environ is None else environ
    for name in RANK_ENV_VARS:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


class RunKilled(BaseException):
    """Raised in the main thread by the SIGTERM handler of ``tracking.base.tracked_run``.

    A ``BaseException`` (like ``KeyboardInterrupt``) so that an engine's ``except Exception``
    does not swallow it.
    """


class RunPreempted(RunKilled):
    """Raised in the main thread when SLURM announces a time limit or a preemption.

    An engine that checkpoints treats it like :class:`RunKilled` (checkpoint, re-raise); the job
    then requeues itself and the requeued job continues the same run (``slca_exp.core.preemption``).
    """


def preempt_signal() -> signal.Signals:
    """The signal SLURM sends before a time limit: submitit's (``$SUBMITIT_PREEMPT_SIGNAL``)."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper().removeprefix("SIG")
    return signal.Signals[f"SIG{name}"]


class _Deferral:
    """Nesting depth of :func:`signals_deferred` and the signal that arrived meanwhile."""

    depth = 0
    pending: tuple[Callable[[int, object], None], int] | None = None


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGTERM and the preemption signal back for the block (work that must not be cut).

    A signal that arrives meanwhile is delivered when the block ends, so ``tracked_run``
    still closes the run KILLED, but never in the middle of a store transaction (a SQLAlchemy
    session interrupted mid-commit refuses every later call, including the one that closes the
    run) nor between a step's update, its metrics and its checkpoint (a resumed run would log a
    step twice or restart from half an update). Blocks nest.

    Two layers: the main thread's signal mask (for signals whose action is the default one),
    and the handlers made with :func:`deferrable`, which only note a signal while a block is
    open (the kernel may hand a process signal to any thread that does not block it, torch's
    or MLflow's, and Python then runs the handler in the main thread at once, mask or not).
    Outside the main thread, where Python runs no signal handler, it does nothing.
    """
    if not in_main_thread():
        yield
        return
    wanted = {signal.SIGTERM, preempt_signal()}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    _Deferral.depth += 1
    try:
        yield
    finally:
        _Deferral.depth -= 1
        signal.pthread_sigmask(signal.SIG_UNBLOCK, wanted - set(previous))
        if _Deferral.depth == 0 and _Deferral.pending is not None:
            handler, signum = _Deferral.pending
            _Deferral.pending = None
            handler(signum, None)  # raises (RunKilled, RunPreempted)


def held_signal() -> int | None:
    """The signal an open :func:`signals_deferred` block is holding back, if any."""
    return None if _Deferral.pending is None else _Deferral.pending[1]


def deferrable(handler: Callable[[int, object], None]) -> Callable[[int, object], None]:
    """``handler`` as a signal handler that waits for the open :func:`signals_deferred` block."""

    def deferred_or_now(signum: int, frame: object) -> None:
        if _Deferral.depth > 0:
            if _Deferral.pending is None:  # the first signal wins; one is enough to stop
                _Deferral.pending = (handler, signum)
            return
        handler(signum, frame)

    return deferred_or_now


@deferrable
def raise_killed(signum: int, frame: object) -> None:
    """The SIGTERM handler of a tracked run: raise :class:`RunKilled` (deferrable)."""
    # Further SIGTERMs while the run is being closed would interrupt the close itself.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise RunKilled(f"received signal {signum}")


def in_main_thread() -> bool:
    """True in the main thread, the only one where Python runs signal handlers."""
    import threading

    return threading.current_thread() is threading.main_thread()


@contextmanager
def env_set(key: str, value: str | None) -> Iterator[None]:
    """``$key`` set to ``value`` (removed when ``None``) for the block, then restored."""
    saved = os.environ.get(key)
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved
