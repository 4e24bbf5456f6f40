"""Sweeps that resume: a sweep run again finishes what it left, under the same parent run.

A sweep's identity is its *sweep key*, a digest of every job's run key (the validated config of
each job, ``config/paths.py``): the same ``slca-exp train -m ...`` command line gives the same
key. Before Hydra starts, ``slca-exp train`` plans the sweep (:func:`plan_sweep`):

    no parent run with this key in the experiment   -> a new sweep (attempt 1), every job
    the newest parent with this key (any status)    -> the same sweep, attempt n + 1:
        a job whose run FINISHED with the job's recipe fingerprint  -> skipped
        every other job (failed, killed, never started)             -> run again

``--resume SWEEP_ID`` plans the sweep of that id from the command line its parent recorded;
``--fresh`` starts a new sweep whatever exists. The plan travels in ``$SLCA_EXP_SWEEP_PLAN``
to the sweep callback (which reopens the parent and records the attempt, ``launch/sweep.py``)
and to the resuming sweeper (``hydra_plugins/slca_exp_resume``), which launches only the
planned jobs: one SLURM array of just those. Each keeps its job number (``$SLCA_EXP_JOB_NUM``)
and its output folder. A job that was interrupted continues its own run from its checkpoint
(the engine's, by run key), and so stays in the sweep it belongs to.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from slca_exp.core.problems import ConfigError, Problem
from slca_exp.core.tags import (
    ATTEMPTS,
    FINGERPRINT,
    JOB,
    PARENT_ROLE,
    ROLE,
    SUPERSEDED_BY,
    SWEEP,
    SWEEP_COMMAND,
    SWEEP_KEY,
)
from slca_exp.tracking.redact import REDACTED

if TYPE_CHECKING:
    from slca_exp.config.schema import RunConfig

PLAN_ENV = "SLCA_EXP_SWEEP_PLAN"
"""The sweep's plan (JSON), from ``slca-exp train`` to the sweep callback and the sweeper."""
JOB_NUM_ENV = "SLCA_EXP_JOB_NUM"
"""A planned job's number in the whole sweep (Hydra numbers only the jobs it launches)."""


@dataclass
class SweepPlan:
    """What one attempt of a sweep runs.

    Attributes:
        key: the sweep key (:func:`sweep_key`).
        command: the ``slca-exp train`` arguments that ran it (what ``--resume`` runs again).
        jobs: every job's overrides of the task (not Hydra's own), by job number.
        run: the job numbers this attempt launches.
        skipped: job number -> the FINISHED run it keeps.
        sweep_id: the sweep resumed (``None``: a new sweep).
        parent_run_id: its parent run.
        attempt: this attempt's number (1: the first).
        store: the MLflow store's URI.
        running: job number -> its run, still RUNNING in the store (run again all the same).
        changed: job number -> its FINISHED run, run again: the recipe fingerprint it recorded
            differs from the job's now (a changed file, prompt or package).

    """

    key: str
    command: list[str]
    jobs: list[list[str]]
    run: list[int]
    skipped: dict[int, str] = field(default_factory=dict)
    sweep_id: str | None = None
    parent_run_id: str | None = None
    attempt: int = 1
    store: str = ""
    running: dict[int, str] = field(default_factory=dict)
    changed: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> str:
        """The plan as ``$SLCA_EXP_SWEEP_PLAN`` carries it."""
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> SweepPlan | None:
        """The plan of the sweep this process runs, if ``slca-exp train`` made one."""
        text = os.environ.get(PLAN_ENV)
        if not text:
            return None
        data = json.loads(text)
        for name in ("skipped", "running", "changed"):
            data[name] = {int(k): v for k, v in data.get(name, {}).items()}
        return cls(**data)

    def record(self) -> dict[str, Any]:
        """The attempt as the parent records it (tag ``slca.attempt.<n>``)."""
        return {"started_ms": int(time.time() * 1000), "run": self.run, "skipped": self.skipped}


@contextmanager
def planned(plan: SweepPlan | None) -> Iterator[None]:
    """``$SLCA_EXP_SWEEP_PLAN`` set to ``plan`` while Hydra runs the sweep."""
    from slca_exp.core.process import env_set

    with env_set(PLAN_ENV, plan.to_json() if plan is not None else None):
        yield


def sweep_key(configs: Sequence[RunConfig]) -> str:
    """Hex digest (16 characters) of every job's run key, in order."""
    from slca_exp.config.paths import run_key

    keys = json.dumps([run_key(c) for c in configs])
    return hashlib.sha256(keys.encode()).hexdigest()[:16]


def plan_sweep(
    jobs: Sequence[Sequence[str]],
    configs: Sequence[RunConfig],
    command: Sequence[str],
    *,
    resume: str | None = None,
    fresh: bool = False,
) -> SweepPlan | None:
    """Plan one attempt of the sweep of ``jobs`` (their checked ``configs``).

    ``None`` when the sweep is not recorded in MLflow (``tracking.backends`` without mlflow):
    then nothing can say which jobs finished, and every job runs (each still continues from its
    own checkpoint).

    Raises:
        ConfigError: ``resume`` names no sweep in the store.

    """
    if not configs or "mlflow" not in configs[0].tracking.backends:
        return None
    key = sweep_key(configs)
    task = [as_hydra_lists([o for o in j if not o.lstrip("+~").startswith("hydra")]) for j in jobs]
    from slca_exp.tracking.mlflow import store_uri

    plan = SweepPlan(key, list(command), task, list(range(len(jobs))))
    plan.store = store_uri(configs[0].tracking)
    if fresh:
        return plan
    try:
        client = _client(plan.store)
        if client is None:  # a local store not created yet: nothing to resume
            return plan
        parent = _parent(client, configs[0].experiment_name, key, resume)
    except Exception as err:  # noqa: BLE001 - the store is away: the jobs spool, as they would
        if resume is not None:
            raise
        print(
            f"slca-exp: cannot read {plan.store} to resume an earlier run of this sweep "
            f"({type(err).__name__}); every job runs, each from its own checkpoint if it has one"
        )
        return plan
    if parent is None and resume is not None:
        raise ConfigError(
            [Problem("--resume", f"no sweep {resume!r} in {plan.store}", "check the sweep id")],
            "the resume command",
        )
    if parent is None:
        return plan
    plan.sweep_id = parent.data.tags.get(SWEEP)
    plan.parent_run_id = parent.info.run_id
    plan.attempt = int(parent.data.tags.get(ATTEMPTS) or 1) + 1
    latest = latest_runs(client, parent)
    finished = {  # a recipe is built only for a job that has a FINISHED run to keep
        num: run
        for num, run in latest.items()
        if num < len(configs) and run.info.status == "FINISHED"
    }
    for num, run in finished.items():
        same = run.data.tags.get(FINGERPRINT) == _fingerprint(configs[num])
        (plan.skipped if same else plan.changed)[num] = run.info.run_id
    plan.run = [num for num in range(len(jobs)) if num not in plan.skipped]
    plan.running = {n: r.info.run_id for n, r in latest.items() if r.info.status == "RUNNING"}
    return plan


def as_hydra_lists(overrides: Sequence[str]) -> list[str]:
    """One job's overrides as Hydra's basic sweeper writes them (``x=false`` -> ``x=False``).

    >>> as_hydra_lists(["engine.progress=false", "+a=1"])
    ['engine.progress=False', '+a=1']
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return list(BasicSweeper.split_arguments(parsed, None)[0][0]) if parsed else []


def latest_runs(client: Any, parent: Any) -> dict[int, Any]:  # noqa: ANN401
    """Job number -> the run of that job under ``parent`` (the newest; none superseded)."""
    from slca_exp.tracking.sweep_runs import children

    runs: dict[int, Any] = {}
    for run in children(client, parent.info.experiment_id, parent.info.run_id):
        num = run.data.tags.get(JOB, "")
        if num.isdigit():
            runs[int(num)] = run  # oldest first: a later one wins
    return runs


def recorded_command(uri: str, sweep_id: str) -> list[str]:
    """The ``slca-exp train`` arguments the sweep ``sweep_id`` recorded on its parent run.

    Raises:
        ConfigError: no such sweep in the store at ``uri``, or it recorded no command line
            (run before sweeps recorded theirs) or only a redacted one.

    """
    from slca_exp.tracking.store import open_client

    parent = _parent(open_client(uri), None, None, sweep_id)
    if parent is None:
        raise ConfigError(
            [
                Problem(
                    "--resume",
                    f"no sweep {sweep_id!r} in {uri}",
                    "give a sweep id as `slca-exp compare` lists them, and --tracking-uri for "
                    "another store",
                )
            ],
            "the resume command",
        )
    text = parent.data.tags.get(SWEEP_COMMAND)
    if not text or REDACTED in text:
        raise ConfigError(
            [
                Problem(
                    "--resume",
                    f"sweep {sweep_id} did not record a command line that can run again"
                    + (" (it held a secret)" if text else ""),
                    "run the sweep's own `slca-exp train -m ...` command again: it resumes too",
                )
            ],
            "the resume command",
        )
    return json.loads(text)


def sweep_parent(client: Any, sweep_id: str) -> Any:  # noqa: ANN401
    """The newest parent run of sweep ``sweep_id`` in any experiment of the store, or ``None``."""
    return _parent(client, None, None, sweep_id)


def _parent(client: Any, experiment: str | None, key: str | None, sweep_id: str | None) -> Any:  # noqa: ANN401
    """The newest parent run of sweep ``sweep_id``, or with sweep key ``key`` in ``experiment``."""
    from slca_exp.tracking.sweep_runs import search_all

    if sweep_id is not None:
        ids = [e.experiment_id for e in client.search_experiments()]
        quoted = sweep_id.replace("'", "\\'")
        found = search_all(client, ids, f"tags.`{SWEEP}` = '{quoted}'")
    else:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            return None
        found = search_all(client, [exp.experiment_id], f"tags.`{SWEEP_KEY}` = '{key}'")
    parents = [run for run in found if run.data.tags.get(ROLE) == PARENT_ROLE]
    return parents[-1] if parents else None


def _client(uri: str) -> Any:  # noqa: ANN401
    """A client on the sweep's store; ``None`` for a local store that does not exist yet."""
    from slca_exp.tracking.store import open_client, sqlite_file

    db = sqlite_file(uri)
    if db is not None and not db.is_file():
        return None
    return open_client(uri)


def _fingerprint(config: RunConfig) -> str | None:
    """The job's recipe fingerprint as its run records it; ``None`` if it cannot be built now."""
    from slca_exp.recipe import build_recipe

    try:
        return build_recipe(config).short_fingerprint
    except ConfigError:  # e.g. its data is generated by the job itself: run it again
        return None


def reopen(client: Any, plan: SweepPlan, sweep_dir: str | None) -> None:  # noqa: ANN401
    """Set the resumed sweep's parent RUNNING again and record this attempt on it."""
    from slca_exp.core.tags import SWEEP_DIR, SWEEP_ERROR, attempt_tag

    assert plan.parent_run_id is not None
    parent = plan.parent_run_id
    client.update_run(parent, status="RUNNING")
    if SWEEP_ERROR in client.get_run(parent).data.tags:  # the last attempt's; this one decides
        client.delete_tag(parent, SWEEP_ERROR)
    record = {**plan.record(), "sweep_dir": sweep_dir}
    client.set_tag(parent, attempt_tag(plan.attempt), json.dumps(record))
    client.set_tag(parent, ATTEMPTS, str(plan.attempt))
    if sweep_dir:
        client.set_tag(parent, SWEEP_DIR, sweep_dir)


def first_attempt_tags(plan: SweepPlan, sweep_dir: str | None, redact: Any) -> dict[str, str]:  # noqa: ANN401
    """A new sweep's parent tags: its key, its command line (redacted), attempt 1."""
    from slca_exp.core.tags import attempt_tag

    record = {**plan.record(), "sweep_dir": sweep_dir}
    return {
        SWEEP_KEY: plan.key,
        SWEEP_COMMAND: redact(json.dumps(plan.command)),
        ATTEMPTS: "1",
        attempt_tag(1): json.dumps(record),
    }


def supersede(client: Any, experiment_id: str | None, parent: str, num: int, run_id: str) -> None:  # noqa: ANN401
    """Mark the earlier runs of job ``num`` under ``parent`` as replaced by ``run_id``."""
    from slca_exp.tracking.sweep_runs import children

    for run in children(client, experiment_id, parent, superseded=True):
        tags = run.data.tags
        if tags.get(JOB) == str(num) and run.info.run_id != run_id and SUPERSEDED_BY not in tags:
            client.set_tag(run.info.run_id, SUPERSEDED_BY, run_id)
