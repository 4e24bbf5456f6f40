"""verl's trainer stops for a requeue and resumes without logging any step twice (no Ray here).

``SLCATrainer``'s hooks and ``fit`` run as they are, in the order verl 0.9.1's
``PPOTrainer.fit`` calls them (:func:`verl_loop`: ``on_step_begin``, the step, verl's
``save_freq`` checkpoint, ``on_step_end``, the step's metrics through verl's own ``Tracking``
into a real MLflow run, next step); verl's checkpoint save and load are stood in for by a
record of the last saved step, as verl's ``latest_checkpointed_iteration.txt`` is. A "job" is
one trainer: the stop request may arrive at any point of it, or it may be killed there
(SIGTERM in a Ray worker raises ``SystemExit``), and the next job resumes from the latest
checkpoint, as verl's ``resume_mode=auto`` does. The real thing, on SLURM with Ray, is
``test_verl_slurm_on_cpu.py``.

The model and verl's trainer are tied by one description of that order,
``stopping.FIT_ORDER``: the installed verl's ``fit`` is checked against it (the check fails
naming verl's version and the first call that moved), and so is :func:`verl_loop`'s own source;
a reordered copy of verl's source shows the check failing.
"""

import inspect
import os
from contextlib import ExitStack
from importlib.metadata import version
from types import SimpleNamespace
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = pytest.mark.verl

from mlflow.tracking import MlflowClient  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402
from verl.utils.tracking import Tracking  # noqa: E402

from slca_exp.engines.verl import stopping  # noqa: E402
from slca_exp.engines.verl.trainer import SLCATrainer  # noqa: E402

VAL_METRIC = "val/score"
"""What the model's validation logs, at the step verl validates at."""
POINTS = ("begin", "step", "end", "log")
"""Where, in each step, a request or a kill may land: before ``on_step_begin``, during the
step, before ``on_step_end`` (after verl's save_freq checkpoint), before the metrics are logged.
"""


class Killed(SystemExit):
    """What SIGTERM raises in a Ray worker (Ray's handler calls ``sys.exit``)."""


def verl_loop(self, agent_loop_manager):
    """verl 0.9.1's ``PPOTrainer.fit`` (trainer_base.py) minus its work: ``stopping.FIT_ORDER``.

    The calls of ``FIT_ORDER`` are verl's, where verl makes them (checked by
    ``test_the_model_calls_the_hooks_in_the_order_of_verls_fit``); what verl does around them
    (validation, rollouts, updates, metrics) is left out, the step is :func:`step`, and
    ``world.tick`` marks where a stop request or a kill may land (:data:`POINTS`).
    """
    world = self._world
    self.logger = Tracking(project_name="p", experiment_name="e", default_backend=["mlflow"])
    if self.config.trainer.get("val_before_train", True):
        self.on_validate_begin()
        self.logger.log(data={VAL_METRIC: 0.0}, step=self.global_steps)  # at the resumed step
        if self.config.trainer.get("val_only", False):
            return
    self.global_steps += 1
    self.on_train_begin()
    while self.global_steps <= self.total_training_steps:
        is_last_step = self.global_steps >= self.total_training_steps
        world.tick("begin")
        self.on_step_begin()
        self.step({}, self.timing_raw)
        save_freq = self.config.trainer.save_freq
        if save_freq > 0 and (is_last_step or self.global_steps % save_freq == 0):
            self._save_checkpoint()
        world.tick("end")
        self.on_step_end()
        test_freq = self.config.trainer.test_freq
        if test_freq > 0 and (is_last_step or self.global_steps % test_freq == 0):
            self.on_validate_begin()
        world.tick("log")
        data = {stopping.STEP_METRIC: self.global_steps, "job": world.job}
        self.logger.log(data=data, step=self.global_steps)
        self.global_steps += 1
        if is_last_step:
            return


def step(self, metrics, timing_raw):
    """verl's step (rollouts, rewards, the update) stood in for by the point "step"."""
    self._world.tick("step")


def save_checkpoint(self):
    self._world.saved.append(self.global_steps)


def load_checkpoint(self):
    self.global_steps = self._world.saved[-1] if self._world.saved else 0


class World:
    """The run folder, the MLflow run and the checkpoints that outlive one job."""

    def __init__(self, folder, run_id, steps, save_freq, validate=True):
        self.folder, self.run_id, self.steps, self.save_freq = folder, run_id, steps, save_freq
        self.validate = validate  # verl's val_before_train (its default: true), test_freq=2
        self.saved: list[int] = []
        self.job = 0
        self.ticks = 0
        self.request_at = self.kill_at = None
        self.request_step = None

    def tick(self, point):
        if self.ticks == self.request_at:
            (self.folder / stopping.STOP_REQUEST_FILE).write_text("")
            self.request_step = self.trainer.global_steps
        if self.ticks == self.kill_at:
            raise Killed(1)
        self.ticks += 1

    def run_job(self, request_at=None, kill_at=None):
        """One job: verl's TaskRunner around our trainer. Returns how it ended."""
        self.job += 1
        self.ticks, self.request_at, self.kill_at = 0, request_at, kill_at
        stopping.clear(self.folder)  # the engine's prepare, in every job
        trainer = SLCATrainer.__new__(SLCATrainer)
        trainer._world = self
        trainer.config = OmegaConf.create(
            {
                "slca_exp": {"stop_request": str(self.folder / stopping.STOP_REQUEST_FILE)},
                "trainer": {
                    "default_local_dir": str(self.folder / "checkpoints"),
                    "save_freq": self.save_freq,
                    "val_before_train": self.validate,
                    "test_freq": 2 if self.validate else -1,
                },
            }
        )
        trainer.total_training_steps = self.steps
        trainer.checkpoint_manager = SimpleNamespace(update_weights=lambda step: None)
        trainer.timing_raw = {}
        trainer._shutdown_dump_executor = lambda: None
        self.trainer = trainer
        os.environ["MLFLOW_RUN_ID"] = self.run_id  # the engine's worker environment
        trainer._load_checkpoint()
        ended = "finished"
        try:
            trainer.fit(agent_loop_manager=None)
        except Killed:
            ended = "killed"
        trainer.logger.finish(exit_code=0 if ended == "finished" else 1)  # verl's TaskRunner
        if stopping.Stopped.read(self.folder) is not None:
            ended = "stopped"
        return ended


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One MLflow store for every example; verl's base methods replaced for the module."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("requeue")
    with ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, {"MLFLOW_TRACKING_URI": uri}))
        stack.enter_context(mock.patch.object(PPOTrainer, "fit", verl_loop))
        stack.enter_context(mock.patch.object(PPOTrainer, "step", step))
        stack.enter_context(mock.patch.object(PPOTrainer, "_save_checkpoint", save_checkpoint))
        stack.enter_context(mock.patch.object(PPOTrainer, "_load_checkpoint", load_checkpoint))
        yield SimpleNamespace(client=client, experiment=experiment, root=tmp_path_factory)


def new_world(store, steps, save_freq, validate=True):
    run = store.client.create_run(store.experiment)
    return World(store.root.mktemp("run"), run.info.run_id, steps, save_freq, validate)


def history(store, world, name=stopping.STEP_METRIC):
    return [(m.step, m.value) for m in store.client.get_metric_history(world.run_id, name)]


def status(store, world):
    return store.client.get_run(world.run_id).info.status


def test_verls_fit_calls_the_hooks_in_the_order_the_requeue_relies_on():
    assert stopping.check_fit_order() == [], "\n".join(stopping.check_fit_order())


def test_the_model_calls_the_hooks_in_the_order_of_verls_fit():
    # the same description verl's fit is checked against: the model cannot drift from it
    assert stopping.fit_order_change(inspect.getsource(verl_loop)) is None


def _moved(source, line, before, which=0):
    """``source`` with a line that holds ``line`` (``which``: its index among them) moved to
    just before the first line that holds ``before``."""
    lines = source.splitlines()
    moving = [i for i, text in enumerate(lines) if line in text][which]
    text = lines.pop(moving)
    (target,) = [i for i, t in enumerate(lines) if before in t][:1]
    indent = lines[target][: len(lines[target]) - len(lines[target].lstrip())]
    lines.insert(target, indent + text.lstrip())
    return "\n".join(lines)


def _replaced(source, old, new):
    assert old in source, old
    return source.replace(old, new, 1)


REORDERED = {
    # each: verl's own fit, changed in one way that would break the requeue
    "metrics logged before on_step_end": (
        lambda s: _moved(s, "self.logger.log(data=metrics", "self.on_step_end()"),
        "call 12 of 16: expected `self.on_step_end()` (in the training loop, under no `if`) "
        "after `self._save_checkpoint()`",
        "found `self.logger.log()` (in the training loop, under no `if`)",
    ),
    "save_freq's checkpoint after on_step_end": (
        lambda s: _moved(s, "self.on_step_end()", 'with marked_timer("save_checkpoint"'),
        "call 11 of 16: expected `self._save_checkpoint()` (in the training loop, under an "
        "`if` on save_freq) after `self.step()`",
        "found `self.on_step_end()` (in the training loop, under `if self.config.trainer.save_",
    ),
    "the step counted before it is logged": (
        lambda s: _moved(s, "self.global_steps += 1", "dapo_filtered_reward_counts =", which=-1),
        "call 14 of 16: expected `self.logger.log()` (in the training loop, under no `if`)",
        "found `self.global_steps += 1` (in the training loop, under no `if`)",
    ),
    "no on_train_begin": (
        lambda s: _replaced(s, "self.on_train_begin()", "pass"),
        "call 6 of 16: expected `self.on_train_begin()`",
        "found `while ... self.global_steps <= self.total_training_steps`",
    ),
    "validation before training not under val_before_train": (
        lambda s: _replaced(s, 'if self.config.trainer.get("val_before_train", True):', "if 1:"),
        "call 2 of 16: expected `self.on_validate_begin()` (outside the training loop, under "
        "an `if` on val_before_train)",
        "found `self.on_validate_begin()` (outside the training loop, under `if 1`)",
    ),
    "a second on_step_begin": (
        lambda s: _replaced(s, "self.on_step_end()", "self.on_step_begin()"),
        "call 12 of 16: expected `self.on_step_end()`",
        "found `self.on_step_begin()`",
    ),
}


@pytest.mark.parametrize("change", REORDERED)
def test_a_reordered_fit_fails_the_check_naming_the_call_and_verls_version(change):
    edit, expected, found = REORDERED[change]
    source = edit(stopping.verl_fit_source())
    (problem,) = stopping.check_fit_order(source)
    assert problem.startswith(f"verl {version('verl')}: ")
    assert "verl.trainer.ppo.v1.trainer_base.PPOTrainer.fit (FIT_ORDER)" in problem
    assert expected in problem and found in problem, problem


def test_a_stop_during_step_2_checkpoints_step_2_and_the_next_job_logs_3_to_5(store, capsys):
    world = new_world(store, steps=5, save_freq=-1)
    assert world.run_job(request_at=POINTS.index("step") + 4) == "stopped"  # during step 2
    assert world.saved == [2]  # on_step_end of step 2, not before
    assert stopping.Stopped.read(world.folder) == stopping.Stopped(
        step=2, checkpoint=str(world.folder / "checkpoints" / "global_step_2")
    )
    assert status(store, world) == "KILLED"  # verl's own finish did not make it FINISHED
    assert world.run_job() == "finished"
    assert status(store, world) == "FINISHED"
    assert sorted(history(store, world)) == [(s, s) for s in range(1, 6)]
    jobs = sorted(history(store, world, "job"))
    assert jobs == [(1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0), (5, 2.0)]
    assert "verl resumed from its checkpoint at RL step 2" in capsys.readouterr().out


def test_a_job_killed_after_logging_past_its_checkpoint_does_not_have_that_step_twice(
    store, capsys
):
    world = new_world(store, steps=5, save_freq=2)
    assert world.run_job(kill_at=POINTS.index("begin") + 4 * 3) == "killed"  # before step 4
    assert world.saved == [2] and status(store, world) == "KILLED"
    assert world.run_job() == "finished"  # resumes at 2, does step 3 again
    assert sorted(history(store, world)) == [(s, s) for s in range(1, 6)]
    assert dict(history(store, world, "job"))[3] == 1.0  # the first job's step 3 stays
    assert "the MLflow run holds RL step 3 already" in capsys.readouterr().out


def test_a_job_killed_between_a_checkpoint_and_its_log_loses_that_step_and_says_so(store, capsys):
    world = new_world(store, steps=3, save_freq=1)
    assert world.run_job(kill_at=POINTS.index("end") + 4) == "killed"  # step 2 saved, not logged
    assert world.saved == [1, 2]
    assert world.run_job() == "finished"
    assert sorted(s for s, _ in history(store, world)) == [1, 3]
    out = capsys.readouterr().out
    assert "RL steps 2..2 are in verl's checkpoint but not in the MLflow run" in out


@settings(max_examples=40, deadline=None)
@given(
    steps=st.integers(2, 6),
    save_freq=st.sampled_from([-1, 1, 2, 3]),
    request=st.one_of(st.none(), st.integers(0, 4 * 6)),
    kill=st.one_of(st.none(), st.integers(0, 4 * 6)),
    validate=st.booleans(),
)
def test_every_step_is_logged_once_whenever_the_stop_or_the_kill_comes(
    store, steps, save_freq, request, kill, validate
):
    world = new_world(store, steps, save_freq, validate)
    first = world.run_job(request_at=request, kill_at=kill)
    if first == "stopped":
        stopped = stopping.Stopped.read(world.folder)
        logged = [s for s, _ in history(store, world)]
        assert stopped.step == max(logged, default=0)  # stopped after its last logged step
        assert stopped.step == (world.saved[-1] if world.saved else 0)  # which is checkpointed
        assert stopped.step <= world.request_step + 1  # within the step after the request
    lost = set()
    if first == "killed" and kill % 4 >= POINTS.index("end"):
        # killed after the step's checkpoint (verl's save_freq, or ours) and before its log:
        # the step is trained, saved and never logged (verl's order); never logged twice
        killed_in = kill // 4 + 1
        lost = {killed_in} & set(world.saved)
    if first != "finished":
        assert status(store, world) == "KILLED"
        assert world.run_job() == "finished"
    assert status(store, world) == "FINISHED"
    logged = [s for s, _ in history(store, world)]
    assert len(logged) == len(set(logged))  # no step twice, whatever happened
    assert set(logged) == set(range(1, steps + 1)) - lost


def test_the_driver_answers_a_signal_while_verls_driver_waits_for_its_trainer():
    # verl's run_ppo waits in ray.get, where Python runs signal handlers about once a second;
    # srun kills a cancelled job's task about a second after SIGTERM. The handler must run while
    # the trainer is still running, not when it returns.
    import signal
    import threading

    trainer_done = threading.Event()

    class Stopped(Exception):
        pass

    def handler(signum, frame):
        raise Stopped

    previous = signal.signal(signal.SIGUSR1, handler)
    main = threading.main_thread().ident
    try:
        threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGUSR1)).start()
        with pytest.raises(Stopped):
            stopping.answering_signals(trainer_done.wait)  # a trainer that never returns by itself
        assert not trainer_done.is_set()
    finally:
        trainer_done.set()
        signal.signal(signal.SIGUSR1, previous)
    assert stopping.answering_signals(lambda x: x + 1, 1) == 2
    with pytest.raises(ZeroDivisionError):
        stopping.answering_signals(lambda: 1 / 0)
