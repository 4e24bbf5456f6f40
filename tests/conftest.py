"""Keep what runs write out of the checkout; spread the suite over two workers safely.

``make test`` runs the suite on two pytest-xdist workers (``--dist loadfile``): every test
file is one unit of work, so a module's shared fixture (one verl run, one SFT) is set up once,
on one worker. The longest files are handed out first (:data:`LONGEST_FIRST`): the SLURM files
mostly wait on their jobs (the CI's one-node SLURM offers more CPU slots than cores), so the
other files run meanwhile. A session fixture that many files use and that costs tens of seconds
is built once per suite, not once per worker (:func:`built_once`). Run without ``-n``,
everything behaves as one session.
"""

import fcntl
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")

# One intra-op thread per process: the suite runs two workers on two cores, and each spawns
# torch processes (CLI runs, SLURM jobs, verl's workers). Tiny models gain little from a second
# thread, while processes whose OpenMP threads outnumber the cores stall one another.
for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """The root logger's level and its handlers' levels as they were before the test.

    Importing vLLM's server (verl's vLLM rollout, vLLM's CLI parser) runs a dependency that sets
    them to ERROR; a test that imports it must not silence the logs of the tests after it.
    """
    import logging

    root = logging.getLogger()
    level, handlers = root.level, [(h, h.level) for h in root.handlers]
    yield
    root.setLevel(level)
    for handler, was in handlers:
        handler.setLevel(was)


collect_ignore_glob = ["**/*_plugin.py"]
"""Plugin modules register their entries when imported: only the processes that name them in
``$SLCA_EXP_PLUGINS`` import them, never the doctest collection of the test process (whose
registries other tests check)."""

LONGEST_FIRST = (
    "tests/launch/test_slurm.py",
    "tests/launch/test_verl_slurm_on_cpu.py",
    "tests/engines/test_learning_signal_on_cpu.py",
    "tests/engines/test_engine_runs_on_cpu.py",
    "tests/engines/verl/test_verl_trains_on_cpu.py",
    "tests/launch/test_serve_vllm_slurm.py",
    "tests/engines/verl/test_vllm_rollout_on_cpu.py",
    "tests/evaluation/test_eval_sweep_on_cpu.py",
    "tests/launch/test_serve_slurm.py",
    "tests/evaluation/test_eval_vllm_on_cpu.py",
    "tests/engines/verl/test_plugin_on_cpu.py",
    "tests/engines/verl/test_public_launchers_on_cpu.py",
    "tests/engines/verl/test_grad_cosine_on_cpu.py",
    "tests/engines/test_sweep_compare_on_cpu.py",
    "tests/tracking/test_mlflow_server_on_cpu.py",
    "tests/test_compare_on_cpu.py",
)
"""Units in the order they are handed out, before all others (which keep the files' order)."""


def _unit(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest units first, the others in the files' order."""
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda it: (rank.get(_unit(it.nodeid), len(rank)), order[id(it)]))


def built_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], T]
) -> T:
    """``build(folder)`` once for the whole suite, whatever the number of xdist workers.

    Each worker is its own pytest session, so a session fixture would otherwise be built by
    every worker that needs it. The first worker builds it in the run's shared temporary folder
    under a file lock and pickles the result; the others wait on the lock and load it.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of this run
    folder, done = root / name, root / f"{name}.pickle"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return pickle.loads(done.read_bytes())
        folder.mkdir(parents=True, exist_ok=True)
        value = build(folder)
        done.write_bytes(pickle.dumps(value))
        return value


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A command's launch folder: ``tmp_path``, outputs under it, no tracking URI from outside."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLCA_EXP_ROOT", str(tmp_path / "out"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.fixture(autouse=True, scope="session")
def _output_root(tmp_path_factory):
    """``SLCA_EXP_ROOT`` (the default ``tracking.root``) in a temporary folder for the session."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SLCA_EXP_ROOT", str(tmp_path_factory.mktemp("slca-exp-root")))
    yield
    mp.undo()
