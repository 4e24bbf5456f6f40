"""Stopping verl's trainer for a requeue, and resuming it without logging any step twice.

verl's trainer runs in a Ray actor (verl's TaskRunner), not in the process SLURM's time-limit
signal reaches first; the two meet through files in ``<run folder>/verl``:

    driver (engine.py)                         trainer (trainer.py, in verl's TaskRunner)
    the time-limit signal -> stop_request  ->  on_step_end: a verl checkpoint of this step
                                               (verl's own _save_checkpoint, where save_freq
                                               saves); the step's metrics are logged
                                               on_step_begin: every logged step is covered
                                               by a checkpoint -> StopForRequeue -> fit returns
    Stopped.read <- stopped.json           <-  Stopped(step, checkpoint).write
    -> RunPreempted -> the job requeues; verl resumes from its latest checkpoint
       (trainer.resume_mode=auto) at the next step, in the same MLflow run

A job stopped hard (SIGTERM or SIGKILL, a node lost) may have logged steps that its latest
checkpoint does not cover; the requeued job trains them again. :class:`SkipLogged` keeps the
run's history as it is: a step the MLflow run already holds is not logged again
(:func:`logged_through`), so no step is logged twice; each is logged by the job that first
finished it. verl saves a step before it logs it: a job killed in that moment leaves a step
that no job logs (the resumed trainer says so), never one logged twice.

verl's MLflow logger attaches to the run that holds our recipe, and ends it FINISHED whatever
happened (and so does MLflow when the process exits); :func:`end_recipe_run` ends it first with
the status the driver gives it too, so that whichever process writes last, the run is never
left RUNNING nor marked FINISHED by a job that was killed.

All of this holds only while verl's ``PPOTrainer.fit`` calls the trainer's hooks in the order
of verl 0.9.1 (:data:`FIT_ORDER`: ``on_step_begin``, the step, verl's ``save_freq`` checkpoint,
``on_step_end``, the step's metrics logged, next step); :func:`check_fit_order` reads the
installed verl's ``fit`` and names what changed and verl's version, so that an upgrade fails in
a test (``tests/launch/test_verl_requeue_on_cpu.py``, which checks its model of ``fit``
against the same order) and not in the middle of a requeue.

The driver answers signals while verl runs (:func:`answering_signals`): SIGTERM closes the runs
KILLED before ``srun`` kills the job's task, and the time-limit signal writes the stop request
at once; ``ray.init`` does not get to replace its SIGTERM handler (:func:`keeping_sigterm_handler`).
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import os
import re
import signal
import sys
import textwrap
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slca_exp.engines.verl.keys import OUR_KEY

STOP_KEY = f"{OUR_KEY}.stop_request"
"""verl config key: the file whose existence asks the trainer to stop for a requeue."""
STOP_REQUEST_FILE = "stop_request"
"""``<run folder>/verl/stop_request``: written by the driver when the time limit is announced."""
STOPPED_FILE = "stopped.json"
"""``<run folder>/verl/stopped.json``: written by the trainer when it stopped for a requeue."""
STEP_METRIC = "training/global_step"
"""verl's own metric logged at every RL step (its value is the step)."""


class StopForRequeue(Exception):  # noqa: N818 - a stop, not an error
    """Raised at a step boundary: a stop was asked for and a checkpoint covers every step."""


@dataclass(frozen=True)
class Stopped:
    """Where the trainer stopped for a requeue."""

    step: int
    """The last RL step it finished and logged (0: it stopped before its first)."""
    checkpoint: str | None
    """verl's checkpoint folder the requeued job resumes from (``None``: none yet)."""

    def write(self, folder: str | Path) -> Path:
        """Write ``stopped.json`` into ``folder`` whole or not at all."""
        path = Path(folder) / STOPPED_FILE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, folder: str | Path) -> Stopped | None:
        """The stop the trainer reported in ``folder``, or ``None`` (it did not stop early)."""
        try:
            data = json.loads((Path(folder) / STOPPED_FILE).read_text())
        except (OSError, ValueError):
            return None
        return cls(step=int(data["step"]), checkpoint=data.get("checkpoint"))


def clear(folder: str | Path) -> None:
    """Remove an earlier job's request and report: a new trainer starts in ``folder``."""
    for name in (STOP_REQUEST_FILE, STOPPED_FILE):
        (Path(folder) / name).unlink(missing_ok=True)


def logged_through(run_id: str, tracking_uri: str | None = None) -> int:
    """The last RL step the MLflow run ``run_id`` holds (0: none).

    Args:
        run_id: the run verl's logger writes to.
        tracking_uri: its store (MLflow's current one when ``None``).

    """
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri).get_metric_history(run_id, STEP_METRIC)
    return max((int(m.step) for m in history), default=0)


class SkipLogged:
    """verl's ``Tracking``, minus the steps the run already holds (a resumed, re-done step).

    Args:
        tracking: verl's ``Tracking`` object (``log(data, step, backend)``, ``finish``).
        through: steps ``1..through`` are in the run already; ``0`` logs everything.

    """

    def __init__(self, tracking: Any, through: int) -> None:  # noqa: ANN401 - verl's Tracking
        self.tracking = tracking
        self.through = through
        self.skipped: list[int] = []

    def log(self, data: Mapping[str, Any], step: int, backend: Any = None) -> None:  # noqa: ANN401
        """Log like verl's ``Tracking.log``, unless the run holds ``step`` already."""
        if 0 < step <= self.through:
            if step not in self.skipped:
                self.skipped.append(step)
                print(
                    f"slca-exp: the MLflow run holds RL step {step} already (an earlier job "
                    "logged it); not logging it again",
                    flush=True,
                )
            return
        self.tracking.log(data=data, step=step, backend=backend)

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401 - finish and the rest: verl's
        return getattr(self.tracking, name)


def end_recipe_run(status: str) -> None:
    """End the MLflow run verl's logger attached to in this process, with ``status``.

    verl's logger would end it FINISHED when the trainer returns or fails, and MLflow would at
    exit; ended here first, neither does (verl's logger ends only an active run).
    """
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None and mlflow.active_run() is not None:
        mlflow.end_run(status)


# -- the driver: signals while verl runs ----------------------------------------------------


@contextlib.contextmanager
def keeping_sigterm_handler() -> Iterator[None]:
    """Keep this process's SIGTERM handler across ``ray.init``, which installs Ray's own.

    Ray's handler exits at once; ours (``tracked_run``, the job's Ray bootstrap) raises
    ``RunKilled``, so that ``scancel`` closes the runs KILLED and stops the job's Ray nodes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)


def answering_signals(fn: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
    """``fn(*args, **kwargs)`` in a thread, while this (main) thread answers signals at once.

    verl's driver waits for its trainer in ``ray.get``, where Python runs signal handlers about
    once a second, and when SLURM cancels a job, ``srun`` kills its task about a second after
    the SIGTERM: waiting here instead, SIGTERM raises ``RunKilled`` at once and the runs are
    closed KILLED in time, and the time-limit signal asks the trainer to stop at once. (A
    ``ray.init`` in ``fn`` then leaves this process's SIGTERM handler alone, too.)

    Raises:
        Whatever ``fn`` raised, or what a signal's handler raised meanwhile.

    """
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            outcome["error"] = exc

    worker = threading.Thread(target=call, name="verl-driver", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(timeout=0.2)  # interrupted by a signal: its handler runs here
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


# -- the order of verl's fit that all of this relies on -------------------------------------

FIT = "verl.trainer.ppo.v1.trainer_base.PPOTrainer.fit"
"""The verl function whose order of calls :data:`FIT_ORDER` describes."""


@dataclass(frozen=True)
class Call:
    """A statement or call of a function body, with where it stands in that body."""

    text: str
    """``self.on_step_end()`` (a call), ``self.global_steps += 1``, ``return``, ``while <test>``."""
    in_loop: bool
    """Whether it is inside a ``while`` or ``for`` loop of the function."""
    guards: tuple[str, ...] = ()
    """The conditions of the ``if`` statements around it, outermost first (``not (...)`` in
    an ``else``); ``with`` and ``try`` blocks leave no trace."""


@dataclass(frozen=True)
class Expected:
    """A call of :data:`FIT_ORDER`: what it is, and where it must stand."""

    what: str
    """How messages name it."""
    pattern: str
    """A regular expression that :attr:`Call.text` matches (``re.match``)."""
    in_loop: bool
    """Whether it must be inside verl's training loop."""
    guards: tuple[str, ...] = ()
    """A name each ``if`` around it must test, one per ``if``: none around it when empty."""

    def names(self, call: Call) -> bool:
        """Whether ``call`` is this call, wherever it stands."""
        return re.match(self.pattern, call.text) is not None

    def matches(self, call: Call) -> bool:
        """Whether ``call`` is this call, standing where it must."""
        if not self.names(call) or call.in_loop != self.in_loop:
            return False
        if len(call.guards) != len(self.guards):
            return False
        return all(re.search(rf"\b{n}\b", g) for n, g in zip(self.guards, call.guards, strict=True))

    def __str__(self) -> str:
        where = "in the training loop" if self.in_loop else "outside the training loop"
        tests = " and ".join(f"an `if` on {name}" for name in self.guards) or "no `if`"
        return f"`{self.what}` ({where}, under {tests})"


_LOOP = r"self\.global_steps <= self\.total_training_steps\b"
_LAST = r"self\.global_steps >= self\.total_training_steps$"
FIT_ORDER: tuple[Expected, ...] = (
    Expected("self.logger = Tracking(...)", r"self\.logger = Tracking\(", False),
    Expected(
        "self.on_validate_begin()", r"self\.on_validate_begin\(\)$", False, ("val_before_train",)
    ),
    Expected("self.logger.log()", r"self\.logger\.log\(\)$", False, ("val_before_train",)),
    Expected("return", r"return$", False, ("val_before_train", "val_only")),
    Expected("self.global_steps += 1", r"self\.global_steps \+= 1$", False),
    Expected("self.on_train_begin()", r"self\.on_train_begin\(\)$", False),
    Expected("while ... self.global_steps <= self.total_training_steps", f"while .*{_LOOP}", False),
    Expected("is_last_step = ... >= self.total_training_steps", f"is_last_step = {_LAST}", True),
    Expected("self.on_step_begin()", r"self\.on_step_begin\(\)$", True),
    Expected("self.step()", r"self\.step\(\)$", True),
    Expected("self._save_checkpoint()", r"self\._save_checkpoint\(\)$", True, ("save_freq",)),
    Expected("self.on_step_end()", r"self\.on_step_end\(\)$", True),
    Expected("self.on_validate_begin()", r"self\.on_validate_begin\(\)$", True, ("test_freq",)),
    Expected("self.logger.log()", r"self\.logger\.log\(\)$", True),
    Expected("self.global_steps += 1", r"self\.global_steps \+= 1$", True),
    Expected("return", r"return$", True, ("is_last_step",)),
)
"""The calls of verl 0.9.1's ``PPOTrainer.fit`` (:data:`FIT`) the requeue relies on, in order.

``SLCATrainer``'s hooks are right only in this order: the logger exists before the first hook
that wraps it (``on_validate_begin`` before training when ``val_before_train``, else
``on_train_begin``); ``global_steps`` is the step after the checkpoint's when training starts;
each step runs ``on_step_begin`` (ours stops there), the step, verl's ``save_freq`` checkpoint,
``on_step_end`` (ours checkpoints there), then logs its metrics (after its checkpoint: a kill
in between loses the step, never logs it twice), and counts. The requeue test's model of
``fit`` (``tests/launch/test_verl_requeue_on_cpu.py``) is checked against it as well, so the
model and verl's trainer cannot drift apart silently.
"""


def calls(source: str) -> list[Call]:
    """The statements and calls of the first function in ``source``, in source order.

    A call is listed as ``<callee>()`` (its arguments left out); an assignment, an augmented
    assignment and a ``return`` as their source; a loop as its header; a plain expression only
    through its calls. Functions defined inside are not entered: they do not run there.
    """
    tree = ast.parse(textwrap.dedent(source))
    function = next(
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )
    found: list[Call] = []
    _body(function.body, False, (), found)
    return found


def _body(body: list[ast.stmt], in_loop: bool, guards: tuple[str, ...], out: list[Call]) -> None:
    for stmt in body:
        if isinstance(stmt, ast.If):
            test = ast.unparse(stmt.test)
            _calls(stmt.test, in_loop, guards, out)
            _body(stmt.body, in_loop, (*guards, test), out)
            _body(stmt.orelse, in_loop, (*guards, f"not ({test})"), out)
        elif isinstance(stmt, ast.While | ast.For | ast.AsyncFor):
            head = stmt.test if isinstance(stmt, ast.While) else stmt.iter
            keyword = "while" if isinstance(stmt, ast.While) else "for"
            out.append(Call(f"{keyword} {ast.unparse(head)}", in_loop, guards))
            _body(stmt.body, True, guards, out)
            _body(stmt.orelse, in_loop, guards, out)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            for item in stmt.items:
                _calls(item.context_expr, in_loop, guards, out)
            _body(stmt.body, in_loop, guards, out)
        elif isinstance(stmt, ast.Try):
            _body(stmt.body, in_loop, guards, out)
            for handler in stmt.handlers:
                _body(handler.body, in_loop, guards, out)
            _body(stmt.orelse, in_loop, guards, out)
            _body(stmt.finalbody, in_loop, guards, out)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        else:
            if isinstance(stmt, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Return):
                out.append(Call(ast.unparse(stmt), in_loop, guards))
            _calls(stmt, in_loop, guards, out)


def _calls(node: ast.AST, in_loop: bool, guards: tuple[str, ...], out: list[Call]) -> None:
    found = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    for call in sorted(found, key=lambda n: (n.lineno, n.col_offset)):
        out.append(Call(f"{ast.unparse(call.func)}()", in_loop, guards))


def _where(what: str, in_loop: bool, guards: Sequence[str]) -> str:
    where = "in the training loop" if in_loop else "outside the training loop"
    conditions = " and ".join(f"`if {_short(g)}`" for g in guards) or "no `if`"
    return f"`{what}` ({where}, under {conditions})"


def _short(text: str, limit: int = 70) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def fit_order_change(source: str) -> str | None:
    """How the calls of ``source`` (a ``fit``) differ from :data:`FIT_ORDER`; ``None``: they don't.

    Only the calls that one of :data:`FIT_ORDER`'s patterns names are compared (verl may add
    other work around them); they must be :data:`FIT_ORDER`'s, one for one and each where it
    must stand: a call moved, repeated, dropped, taken out of the loop or out from under its
    ``if`` (or put under another) is a change. The message names the first difference.
    """
    named = [c for c in calls(source) if any(e.names(c) for e in FIT_ORDER)]
    for index, expected in enumerate(FIT_ORDER):
        position = f"call {index + 1} of {len(FIT_ORDER)}"
        after = f" after {FIT_ORDER[index - 1]}" if index else ""
        if index >= len(named):
            return f"{position}: expected {expected}{after}, found no more calls"
        call = named[index]
        if not expected.matches(call):
            what = next(e.what for e in FIT_ORDER if e.names(call))
            found = _where(what, call.in_loop, call.guards)
            return f"{position}: expected {expected}{after}, found {found}"
    if len(named) > len(FIT_ORDER):
        extra = named[len(FIT_ORDER)]
        what = next(e.what for e in FIT_ORDER if e.names(extra))
        return f"an extra call after the last one: {_where(what, extra.in_loop, extra.guards)}"
    return None


def verl_fit_source() -> str:
    """The source of :data:`FIT` as the installed verl's file has it.

    Read from the module's file, not from the class: a test that puts its own ``fit`` on
    ``PPOTrainer`` does not change what is checked.
    """
    from verl.trainer.ppo.v1 import trainer_base

    source = inspect.getsource(trainer_base)
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == "PPOTrainer":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "fit":
                    return textwrap.dedent(ast.get_source_segment(source, item, padded=True))
    raise LookupError(f"{FIT} is not defined in {trainer_base.__file__}")


def check_fit_order(source: str | None = None) -> list[str]:
    """What changed in the order of verl's ``fit``, naming verl's version; ``[]``: nothing.

    Args:
        source: a ``fit`` to check instead of the installed verl's (:data:`FIT`).

    """
    from importlib.metadata import version

    try:
        what = fit_order_change(verl_fit_source() if source is None else source)
    except Exception as err:  # noqa: BLE001 - a function gone or unparsable is a change too
        what = f"{type(err).__name__}: {err}"
    if what is None:
        return []
    return [
        f"verl {version('verl')}: stopping for a requeue relies on the order of the calls of "
        f"{FIT} (FIT_ORDER): {what}; see slca_exp/engines/verl/stopping.py"
    ]
