"""One run's eval, here or as a SLURM job of its own (``eval.launcher=<profile>``).

:func:`evaluate_run` is the whole of it: the run's checkpoint, the key its scores are kept by,
the benchmark's environment, the server, the scores, the run's new metrics. ``slca-exp eval``
calls it for each run in this process (``eval.launcher=local``), or submits one :class:`EvalJob`
per run through submitit with the profile's resources (the profile's GPUs serve the checkpoint
on the node) and waits for them. A job logs into the same store the runs trained into, so that
store must be reachable from the nodes, as it is for the training jobs (a tracking server, or a
file store on a shared filesystem); the benchmark's environment is built there once, under its
lock, on the shared ``eval.env_root``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slca_exp.config.paths import output_root
from slca_exp.core.names import EVAL_OVERALL, eval_metric
from slca_exp.evaluation import environment, scoring
from slca_exp.evaluation.benchmark import Benchmark
from slca_exp.evaluation.settings import EvalSettings


def evaluate_run(
    client: Any,  # noqa: ANN401
    run: Any,  # noqa: ANN401
    benchmark: Benchmark,
    settings: EvalSettings,
    folder: Path,
    say: Callable[[str], None],
    checkpoint: scoring.Checkpoint | None = None,
) -> str:
    """Score the run's checkpoint into the run, unless it holds these scores; what happened.

    ``folder/<run id>`` keeps what the eval wrote: the server's log, the driver's, BFCL's
    result and score files (and the checkpoint, when it had to be copied from MLflow).

    Raises:
        scoring.EvalError: no checkpoint, a server that never answered, a failed driver.

    """
    if checkpoint is None:  # else found by the caller already (slca-exp eval checks it first)
        checkpoint = scoring.checkpoint_of(client, run, folder / run.info.run_id)
    key = scoring.eval_key(benchmark, checkpoint, settings)
    if scoring.scored_already(run, benchmark, key) and not settings.rescore:
        return (
            f"run {checkpoint.run_id}: already scored on {benchmark.name} {benchmark.version} "
            "(the same checkpoint and sample, served the same way): scores kept; "
            "eval.rescore=true scores it again"
        )
    try:
        env = environment.bfcl_env(benchmark.version, environment.env_root(settings.env_root), say)
    except environment.BuildError as err:
        raise scoring.EvalError(
            f"{err}\n(a node without the package registry cannot build it: build it once where "
            "the registry is reachable, into the shared eval.env_root: slca-exp eval "
            "--prepare-env eval.env_root=<shared folder>)"
        ) from None
    work = folder / checkpoint.run_id
    scores, ran = scoring.score(checkpoint, benchmark, settings, env, work, say=say)
    scoring.log_scores(client, checkpoint, benchmark, settings, env, key, scores, ran)
    parts = ", ".join(f"{c} {v['accuracy']:.3f}" for c, v in scores.categories.items())
    overall = eval_metric(benchmark.name, EVAL_OVERALL)
    return f"run {checkpoint.run_id}: {overall} {scores.overall:.3f} ({parts}); logged to the run"


@dataclass
class EvalJob:
    """What ``eval.launcher=<profile>`` submits for one run: :func:`evaluate_run` on the node."""

    tracking_uri: str
    run_id: str
    benchmark: Benchmark
    settings: EvalSettings
    folder: str

    def __call__(self) -> str:
        """Run on the node: score the run's checkpoint into it; what happened."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.tracking_uri)
        run = client.get_run(self.run_id)
        return evaluate_run(client, run, self.benchmark, self.settings, Path(self.folder), _say)


def submit(job: EvalJob, profile: Any, folder: Path) -> Any:  # noqa: ANN401 - submitit's
    """Submit ``job`` with the profile's resources; its logs under ``folder/<job id>``."""
    from slca_exp.launch.service_job import one_node_executor

    return one_node_executor(profile, folder, f"slca-eval-{job.run_id[:8]}").submit(job)


def _say(line: str) -> None:
    print(f"slca-exp eval: {line}", file=sys.stderr, flush=True)


def after_train(config: Any, tracking_uri: str, run_id: str | None) -> str:  # noqa: ANN401
    """``eval.after_train``: the finished run's checkpoint scored into it, in the same job.

    Checked before the run started (:func:`slca_exp.evaluation.options.after_train`); a
    failure here leaves the trained run as it is and says how to score it later.
    """
    from mlflow.tracking import MlflowClient

    from slca_exp.evaluation.options import after_train as load

    benchmark, settings, problems = load(config)
    if problems or benchmark is None or settings is None:  # checked at start: not reached
        return "eval.after_train: " + "; ".join(str(p) for p in problems)
    if run_id is None:
        return "eval.after_train: the run has no MLflow run to score"
    client = MlflowClient(tracking_uri=tracking_uri)
    folder = output_root(config.tracking) / "eval"
    try:
        return evaluate_run(client, client.get_run(run_id), benchmark, settings, folder, _say)
    except scoring.EvalError as err:
        return (
            f"run {run_id}: not scored after training: {err}; score it later with "
            f"slca-exp eval {run_id}"
        )
