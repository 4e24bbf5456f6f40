"""Run one function in several processes that start at the same moment.

The processes are forked from a fork server that has imported MLflow, torch and slca-exp once,
so they start in milliseconds; they wait at one barrier, passed once all of them are up, so
that their first steps collide as those of jobs started together do. They are not forked from
the test process itself: a pytest worker that has already run Ray, gRPC or OpenMP threads in
earlier tests cannot fork safely (a child can hang on a lock a vanished thread held).
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_FORK = mp.get_context("forkserver")
_FORK.set_forkserver_preload(  # what the tests' targets import, so that no child imports it again
    [
        "torch",
        "transformers.models.qwen2.modeling_qwen2",
        "mlflow",
        "pytest",
        "hypothesis",
        "slca_exp.commands.train",
        "slca_exp.backbones",
        "slca_exp.tracking.mlflow",
        "tests.concurrency",
    ]
)
SHM = Path("/dev/shm")


@contextmanager
def memory_folder() -> Iterator[Path]:
    """A fresh folder in memory (``/dev/shm``) when there is one, else on disk; removed after.

    A new MLflow store runs some 60 schema migrations, each committed with an fsync: on a busy
    disk that takes seconds, in memory a fraction. Locks behave the same on both.
    """
    folder = Path(tempfile.mkdtemp(dir=SHM if SHM.is_dir() else None, prefix="slca-exp-test-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _child(target: Callable[..., Any], args: tuple, go: Any, out: Any, index: int) -> None:  # noqa: ANN401
    go.wait()  # a barrier: every process is up
    try:
        out.put((index, True, target(*args)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        out.put((index, False, traceback.format_exc()))


def run_together(
    target: Callable[..., Any], calls: Sequence[tuple], timeout_s: float = 120.0
) -> list[Any]:
    """``target(*args)`` for each ``args`` of ``calls``, each in its own process, all at once.

    Returns:
        The return values, in the order of ``calls``.

    Raises:
        AssertionError: a process raised (its traceback is the message) or did not report.

    """
    go, out = _FORK.Barrier(len(calls) + 1), _FORK.Queue()
    procs = [
        _FORK.Process(target=_child, args=(target, args, go, out, i))
        for i, args in enumerate(calls)
    ]
    for proc in procs:
        proc.start()
    go.wait(timeout=timeout_s)
    results: dict[int, Any] = {}
    failures = []
    for _ in procs:
        index, ok, value = out.get(timeout=timeout_s)
        if ok:
            results[index] = value
        else:
            failures.append(f"process {index}:\n{value}")
    for proc in procs:
        proc.join(timeout=timeout_s)
    assert not failures, "\n".join(failures)
    return [results[i] for i in range(len(calls))]
