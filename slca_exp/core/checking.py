"""The context a check runs in: may it create files, are this host's resources the run's.

``validate``, ``train --dry-run`` and ``train --cfg`` run a run's checks inside
:func:`creating_nothing`: what a run would build (a synthetic split, a built-in backbone's
checkpoint) is reported, not built. A command whose jobs run on this host runs them inside
:func:`on_this_host`, where a check may judge this host's GPUs. The checks read both through
:func:`may_create` and :func:`runs_here`, so that every check keeps its one signature.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_CREATING: ContextVar[bool] = ContextVar("slca_exp_creating", default=True)
_HERE: ContextVar[bool] = ContextVar("slca_exp_runs_here", default=False)


def may_create() -> bool:
    """False inside :func:`creating_nothing`: report what a run would build, do not build it.

    Read where a check would otherwise write (the recipe's synthetic split, verl's built-in
    backbone checkpoint), so that an engine's check keeps its one signature.
    """
    return _CREATING.get()


@contextmanager
def creating_nothing() -> Iterator[None]:
    """Run the checks of the block without generating data or building checkpoints."""
    with _holding(_CREATING, False):
        yield


def runs_here() -> bool:
    """True inside :func:`on_this_host`: this host's resources (GPUs) are the run's.

    A command line whose jobs run here (Hydra's basic launcher) checks them before it starts.
    A submission does not (a login node has no GPUs), nor does a job before its Ray cluster is
    up; the engine checks them again when it starts.
    """
    return _HERE.get()


@contextmanager
def on_this_host() -> Iterator[None]:
    """Within the block, the checks may judge this host's resources (:func:`runs_here`)."""
    with _holding(_HERE, True):
        yield


@contextmanager
def _holding(var: ContextVar[bool], value: bool) -> Iterator[None]:
    """``var`` holds ``value`` within the block (nested blocks restore the outer value)."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)
