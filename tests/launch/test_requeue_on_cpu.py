"""The preemption signal goes through the run first, then to submitit's requeue (no SLURM here).

The real thing (a SLURM time limit, a requeue, the same MLflow run continued) is in
``test_slurm.py``; these tests pin the order of events with a stand-in for submitit's handler.
"""

import signal
import threading
import time

import pytest
from mlflow.tracking import MlflowClient

from slca_exp.core.preemption import preemption_requeues, preemption_stops, submitit_handler
from slca_exp.core.process import (
    RunKilled,
    RunPreempted,
    deferrable,
    held_signal,
    preempt_signal,
    signals_deferred,
)
from slca_exp.tracking.base import MultiTracker


class FakeSubmititHandler:
    """Has submitit's method name, which is how the installed handler is recognised."""

    def __init__(self):
        self.calls = []

    def checkpoint_and_try_requeue(self, signum, frame):
        self.calls.append(signum)
        raise SystemExit(-1)  # submitit requeues, then exits the process


@pytest.fixture
def submitit_job(monkeypatch):
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.delenv("RANK", raising=False)
    fake = FakeSubmititHandler()
    previous = signal.signal(signal.SIGUSR2, fake.checkpoint_and_try_requeue)
    previous_term = signal.getsignal(signal.SIGTERM)
    yield fake
    signal.signal(signal.SIGUSR2, previous)
    signal.signal(signal.SIGTERM, previous_term)  # a requeue leaves SIGTERM ignored


def test_the_engine_checkpoints_before_submitit_requeues(submitit_job):
    events = []
    with pytest.raises(SystemExit), preemption_requeues(checkpointable=True) as routed:
        assert routed
        try:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR2)
            events.append("kept running")  # never: the signal raises at once
        except RunKilled as err:  # an engine's handler: RunPreempted is a RunKilled
            assert isinstance(err, RunPreempted)
            events.append("checkpointed")
            raise
    assert events == ["checkpointed"]
    assert submitit_job.calls == [signal.SIGUSR2]
    # submitit's handler is back in place for whatever runs after the task
    assert signal.getsignal(signal.SIGUSR2) == submitit_job.checkpoint_and_try_requeue


def test_slurms_sigterm_after_the_requeue_does_not_turn_it_into_a_kill(submitit_job):
    # `scontrol requeue` stops the job at once: SIGTERM reaches it while submitit's handler
    # still runs. The job must leave as requeued (SystemExit), not as killed (RunKilled), or
    # submitit records the kill as the job's result and the command stops waiting for it.
    class RequeueThenSigterm(FakeSubmititHandler):
        def checkpoint_and_try_requeue(self, signum, frame):
            self.calls.append(signum)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)  # SLURM's
            time.sleep(0.1)
            raise SystemExit(-1)

    @deferrable
    def killed(signum, frame):  # the job's Ray bootstrap: SIGTERM raises RunKilled
        raise RunKilled(f"received signal {signum}")

    requeue = RequeueThenSigterm()
    signal.signal(signal.SIGUSR2, requeue.checkpoint_and_try_requeue)
    signal.signal(signal.SIGTERM, killed)
    with pytest.raises(SystemExit), preemption_requeues(checkpointable=True):
        raise RunPreempted("the engine checkpointed")
    assert requeue.calls == [signal.SIGUSR2]


def test_a_signal_during_a_recorded_step_waits_for_the_step(submitit_job):
    events = []
    with pytest.raises(SystemExit), preemption_requeues(checkpointable=True):
        try:
            with signals_deferred():
                signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR2)
                with signals_deferred():  # nested: the outer block still holds the signal
                    events.append("update")
                events.append("metrics and checkpoint")
            events.append("next step")
        except RunPreempted:
            events.append("preempted")
            raise
    assert events == ["update", "metrics and checkpoint", "preempted"]


def test_a_signal_caught_by_another_thread_still_waits_for_the_step(submitit_job):
    # The kernel hands a process signal to any thread that does not block it (torch's, MLflow's);
    # Python then runs the handler in the main thread at once, whatever the main thread's mask.
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    events = []
    try:
        with pytest.raises(SystemExit), preemption_requeues(checkpointable=True):
            try:
                with signals_deferred():
                    signal.pthread_kill(other.ident, signal.SIGUSR2)
                    deadline = time.monotonic() + 10
                    while held_signal() is None and time.monotonic() < deadline:
                        time.sleep(0.01)  # the handler runs here, in the main thread
                    assert held_signal() == signal.SIGUSR2  # noted, not raised
                    events.append("step recorded")
                events.append("next step")
            except RunPreempted:
                events.append("preempted")
                raise
    finally:
        stop.set()
        other.join()
    assert events == ["step recorded", "preempted"]


def test_while_a_trainer_elsewhere_trains_the_signal_asks_it_to_stop_then_the_job_requeues(
    submitit_job,
):
    # verl's trainer runs in a Ray actor: the driver asks it to stop, waits for it to save and
    # stop at a step boundary, then raises RunPreempted itself.
    events = []
    main = threading.main_thread().ident
    with pytest.raises(SystemExit), preemption_requeues(checkpointable=True):
        with preemption_stops(lambda: events.append("stop asked")) as stop:
            signal.pthread_kill(main, signal.SIGUSR2)
            signal.pthread_kill(main, signal.SIGUSR2)  # a second signal changes nothing
            events.append("trainer saved and stopped")
        assert stop.requested and stop.signal == signal.SIGUSR2
        events.append("engine raises")
        raise RunPreempted("the trainer stopped after a checkpoint")
    assert events == ["stop asked", "trainer saved and stopped", "engine raises"]
    assert submitit_job.calls == [signal.SIGUSR2]  # requeued once, after the stop


def test_a_stop_asked_as_the_training_ends_changes_nothing(submitit_job):
    with preemption_requeues(checkpointable=True) as routed:
        assert routed
        with preemption_stops(lambda: None) as stop:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR2)
        assert stop.requested  # the engine sees its trainer finished anyway: nothing raised
    assert submitit_job.calls == []  # not requeued


def test_without_routing_the_signal_is_left_to_submitit(submitit_job):
    asked = []
    with preemption_stops(lambda: asked.append(1)) as stop:  # no preemption_requeues block
        assert signal.getsignal(signal.SIGUSR2) == submitit_job.checkpoint_and_try_requeue
    assert not stop.requested and asked == []


def test_only_rank_0_of_a_checkpointable_submitit_job_routes_the_signal(submitit_job, monkeypatch):
    with preemption_requeues(checkpointable=False) as routed:
        assert not routed
    monkeypatch.setenv("SLURM_PROCID", "1")
    with preemption_requeues(checkpointable=True) as routed:
        assert not routed
    assert signal.getsignal(signal.SIGUSR2) == submitit_job.checkpoint_and_try_requeue
    monkeypatch.delenv("SUBMITIT_EXECUTOR")
    assert submitit_handler(signal.SIGUSR2) is None


def test_the_preemption_signal_follows_submitits_variable(monkeypatch):
    assert preempt_signal() == signal.SIGUSR2
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    assert preempt_signal() == signal.SIGUSR1
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "SIGTERM")
    assert preempt_signal() == signal.SIGTERM


def test_a_job_stopped_while_its_runs_open_continues_them_when_it_runs_again(tmp_path, monkeypatch):
    # SLURM may announce a time limit up to a minute early: the signal can reach a job while its
    # MLflow run is being opened, before the engine has saved anything. The requeued job must
    # still continue that run, not open a second one.
    from slca_exp import train
    from slca_exp.engines.local.engine import LocalEngine
    from slca_exp.preflight.compose import compose_run

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("SLCA_EXP_PARENT_RUN_ID", raising=False)
    cfg = compose_run([f"tracking.root={tmp_path / 'out'}", f"data.dir={tmp_path / 'data'}"])
    config, engine, recipe = train.prepare(cfg)
    opened = MultiTracker.start

    def start_then_signal(self, recipe, params):
        opened(self, recipe, params)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)

    steps = []
    monkeypatch.setattr(MultiTracker, "start", start_then_signal)
    monkeypatch.setattr(LocalEngine, "run", lambda self, *args: steps.append("first"))
    with pytest.raises(RunKilled):
        train._run_prepared(cfg, config, engine, recipe)
    assert steps == []  # stopped before the engine started
    client = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    (killed,) = client.search_runs([client.get_experiment_by_name("slca-exp").experiment_id])
    assert killed.info.status == "KILLED"  # closed, never left RUNNING
    assert engine.resume_ids(config) == {"mlflow": killed.info.run_id}

    def one_step(self, config, recipe, tracker):
        tracker.log_metrics({"train/loss": 1.0}, 1)

    monkeypatch.setattr(MultiTracker, "start", opened)
    monkeypatch.setattr(LocalEngine, "run", one_step)
    train._run_prepared(cfg, config, engine, recipe)  # the requeued job: the same command
    (run,) = client.search_runs([client.get_experiment_by_name("slca-exp").experiment_id])
    assert run.info.run_id == killed.info.run_id and run.info.status == "FINISHED"
    assert run.data.tags["slca.resumed"] == "true"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [1]
