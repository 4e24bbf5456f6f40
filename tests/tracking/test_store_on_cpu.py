"""Many processes, one MLflow store: opening a fresh store together, locked writes, the spool."""

import sqlite3
from pathlib import Path

# The processes are forked from this one: with MLflow's sqlite store imported here, they do not
# each import it again.
import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from slca_exp.preflight.compose import compose_run
from slca_exp.preflight.validate import validate
from slca_exp.recipe import build_recipe
from slca_exp.tracking import store as store_module
from slca_exp.tracking.mlflow import MlflowTracker, get_or_create_experiment
from slca_exp.tracking.redact import Redactor
from slca_exp.tracking.store import is_locked, open_client, retry_locked, sqlite_file
from tests.concurrency import memory_folder, run_together

PROCESSES = 6
ROUNDS = 3
"""Fresh stores opened by six processes at once. Without the lock nearly every round fails
(five of six processes, in MLflow's schema migration); ``benchmarks/store_concurrency.py
--race-rounds`` repeats it enough to catch a race that wins one round in ten."""


def locked_error() -> MlflowException:
    """What MLflow's sqlite store raises on a locked database (the driver's error as cause)."""
    try:
        raise sqlite3.OperationalError("database is locked")
    except sqlite3.OperationalError as cause:
        err = MlflowException("(sqlite3.OperationalError) database is locked")
        err.__cause__ = cause
        return err


def open_and_run(root: str, steps: int) -> str:
    """One job's use of the store: open it, get or create the experiment, one run, ``steps``."""
    uri = f"sqlite:///{root}/mlflow.db"
    client = open_client(uri)
    experiment = get_or_create_experiment(client, "slca-exp", Path(root))
    run = client.create_run(experiment).info.run_id
    for step in range(steps):
        client.log_metric(run, "loss", float(step), step=step)
    client.set_terminated(run, "FINISHED")
    return run


@pytest.mark.slow
def test_a_fresh_store_opened_by_many_processes_at_once():
    for _ in range(ROUNDS):
        with memory_folder() as root:
            runs = run_together(open_and_run, [(root, 3)] * PROCESSES)
            client = MlflowClient(f"sqlite:///{root}/mlflow.db")  # it opens afterwards
            (experiment,) = [e for e in client.search_experiments() if e.name == "slca-exp"]
            found = client.search_runs([experiment.experiment_id])
            assert sorted(r.info.run_id for r in found) == sorted(runs)
            for run in found:
                assert run.info.status == "FINISHED"
                history = client.get_metric_history(run.info.run_id, "loss")
                assert sorted(m.step for m in history) == [0, 1, 2]
            assert Path(root, "mlflow.db.lock").is_file()


def test_sqlite_file():
    assert sqlite_file("sqlite:////abs/mlflow.db") == Path("/abs/mlflow.db")
    assert sqlite_file("sqlite:///rel/mlflow.db") == Path("rel/mlflow.db")
    assert sqlite_file("sqlite:////a%20b/m.db?mode=rwc") == Path("/a b/m.db")
    for uri in ("sqlite://", "http://127.0.0.1:5000", "file:///tmp/mlruns", "databricks"):
        assert sqlite_file(uri) is None


def test_is_locked_follows_the_cause():
    assert is_locked(locked_error())
    assert is_locked(sqlite3.OperationalError("database table is locked"))
    assert not is_locked(MlflowException("Run 'x' not found"))
    assert not is_locked(ConnectionError("refused"))


class Flaky:
    """A call that fails ``failures`` times with ``error``, then returns how often it was called."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return self.calls


class FakeTime:
    """A clock that only the waits move (attempts take no time)."""

    def __init__(self) -> None:
        self.now, self.waits = 0.0, []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


@settings(max_examples=60, deadline=None)
@given(failures=st.integers(0, 40), budget=st.floats(0.0, 30.0))
def test_retry_locked_is_bounded_and_returns_once_it_succeeds(failures, budget):
    fake = FakeTime()
    call = Flaky(failures, locked_error())
    try:
        result = retry_locked(call, budget_s=budget, sleep=fake.sleep, clock=fake.clock)
    except MlflowException:
        # Gave up: only once the whole budget had passed, and not a wait beyond it.
        assert call.calls <= failures and fake.now == pytest.approx(budget)
    else:
        assert result == call.calls == failures + 1 and len(fake.waits) == failures
        assert fake.now <= budget + 1e-9
    assert all(w >= 0 for w in fake.waits)
    assert all(w <= store_module.MAX_WAIT_S * 1.5 for w in fake.waits)


def test_retry_locked_does_not_retry_other_errors():
    call = Flaky(1, MlflowException("Run 'x' not found"))
    with pytest.raises(MlflowException, match="not found"):
        retry_locked(call, sleep=lambda _: pytest.fail("waited for a non-lock error"))
    assert call.calls == 1


@pytest.fixture()
def tracker():
    with memory_folder() as root:
        overrides = [f"tracking.root={root}", "tracking.retry_every_s=0.01", "data.rows=8"]
        config = validate(compose_run(overrides))
        tracker = MlflowTracker(config.tracking, "locked", Redactor())
        tracker.start(build_recipe(config), {"seed": 1})
        yield tracker


def test_a_locked_write_is_retried_then_spooled_and_every_step_lands_once(tracker, monkeypatch):
    # A budget that three failed writes cannot outlast on the slowest machine
    monkeypatch.setattr(store_module, "LOCKED_RETRY_S", 60.0)
    client = tracker.client
    real = client.log_batch
    locked = {"left": 3}  # the next three writes meet a locked database

    def log_batch(*args, **kwargs):
        if locked["left"] > 0:
            locked["left"] -= 1
            raise locked_error()
        return real(*args, **kwargs)

    monkeypatch.setattr(client, "log_batch", log_batch)
    tracker.log_metrics({"loss": 1.0}, 0)  # retried until the lock goes: logged, nothing spooled
    assert locked["left"] == 0 and len(tracker.spool) == 0

    locked["left"] = 10**6  # the store stays locked past the retry budget: steps are spooled
    monkeypatch.setattr(store_module, "LOCKED_RETRY_S", 0.2)
    tracker.log_metrics({"loss": 2.0}, 1)
    tracker.log_metrics({"loss": 3.0}, 2)
    assert len(tracker.spool) == 2

    locked["left"] = 0
    tracker.finish("FINISHED")  # replayed in order
    history = MlflowClient(tracker.uri).get_metric_history(tracker.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 1.0), (1, 2.0), (2, 3.0)]
    assert MlflowClient(tracker.uri).get_run(tracker.run_id).info.status == "FINISHED"
    assert not tracker.spool.path.exists()
