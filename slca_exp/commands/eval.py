"""slca-exp eval: score a run's checkpoint, or every job's of a sweep, on a benchmark.

    slca-exp eval RUN_OR_SWEEP [benchmark=NAME] [benchmark.KEY=V ...] [eval=NAME] [eval.KEY=V ...]
                  [--dry-run] [--tracking-uri URI] [--out DIR] [--config-dir DIR]
    slca-exp eval --prepare-env [benchmark=NAME] [eval.env_root=DIR]

RUN_OR_SWEEP is a run id or name, a sweep id, a sweep's parent run id or an experiment name.
benchmark= picks the benchmark (default bfcl_v3: BFCL's v3 categories, bfcl-eval 2026.3.23);
eval= how the checkpoint is served (default gpu: vLLM's CUDA build; cpu: vLLM's CPU build).
Every problem of both is reported, each naming its key, before anything is served (exit 2).

Each run's final policy is served by vLLM with the tool-call parser of the trained chat
template, the benchmark's own generation and checker run against it in the benchmark's own
environment (built once, under a lock, and recorded), and the scores go into the run that
trained the checkpoint: metrics eval/<benchmark>/<category> and eval/<benchmark>/overall, the
item table eval/<benchmark>/items.json and tags slca.eval.<benchmark>.*. A run already scored
on the same benchmark version, sample and checkpoint, served the same way, keeps its scores
(eval.rescore=true scores it again). --dry-run shows what would be served and scored, and
starts nothing; --prepare-env only builds the benchmark's environment (on a login node, for
compute nodes that cannot reach the package registry). slca-exp compare then reads the eval/*
metrics like any other.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slca_exp.analysis.runs import CompareError, find_runs
from slca_exp.core.problems import EXIT_BAD_CONFIG, refuse
from slca_exp.core.shown import shown_path, shown_uri
from slca_exp.core.tags import PARENT_ROLE, ROLE, STAGE
from slca_exp.evaluation import settings as evals
from slca_exp.evaluation.benchmark import TAU2_UNAVAILABLE
from slca_exp.tracking import readback

EXIT_FAILED = 1
USAGE = __doc__.split("\n\n")[1]
HELP = __doc__.split("\n\n", 2)[2]


def main(argv: Sequence[str]) -> int:
    """``slca-exp eval ...``; returns the exit status."""
    parser = _parser()
    try:
        args, rest = parser.parse_known_args(list(argv))
        # RUN_OR_SWEEP is the one argument that is not KEY=V, wherever it stands
        given = [*([args.target] if args.target else []), *rest]
        targets = [a for a in given if "=" not in a]
        rest = [a for a in given if "=" in a]
        if len(targets) > 1:
            parser.error(f"one RUN_OR_SWEEP at a time (got {', '.join(targets)})")
        args.target = targets[0] if targets else None
        if args.target is None and not args.prepare_env:
            parser.error("the following arguments are required: RUN_OR_SWEEP")
        if args.target is not None and args.prepare_env:
            parser.error("--prepare-env builds the environment only: give no RUN_OR_SWEEP")
    except SystemExit as exit_:  # argparse has printed the usage and the reason (or the help)
        return int(exit_.code or 0)
    benchmark, settings, profile, problems = _load(rest, args.config_dir)
    if args.prepare_env:  # nothing is served: only what picks the environment matters
        problems = [p for p in problems if p.key.startswith(("benchmark", "eval.env_root"))]
    if problems or benchmark is None or settings is None:
        return refuse(problems, "the eval")
    if benchmark.kind != "bfcl":
        print(f"slca-exp eval: benchmark={benchmark.name}: {TAU2_UNAVAILABLE}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if args.prepare_env:
        return _prepare_env(benchmark, settings)
    return _eval(args, benchmark, settings, profile)


def _prepare_env(benchmark, settings) -> int:  # noqa: ANN001
    """``--prepare-env``: the benchmark's environment, built here if it is not yet."""
    from slca_exp.evaluation import environment

    try:
        env = environment.bfcl_env(
            benchmark.version, environment.env_root(settings.env_root), say=say
        )
    except environment.BuildError as err:
        say(str(err))
        return EXIT_FAILED
    say(f"BFCL's environment (bfcl-eval {benchmark.version}) is ready: {env.folder}")
    return 0


def _parser() -> argparse.ArgumentParser:
    # Plain text: the module docstring's markup would reach the terminal as it is.
    parser = argparse.ArgumentParser(
        prog="slca-exp eval",
        usage=USAGE.strip().removeprefix("slca-exp eval").join(["%(prog)s", ""]),
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "target",
        nargs="?",
        metavar="RUN_OR_SWEEP",
        help="a run id or name, a sweep id, a sweep's parent run id, or an experiment name",
    )
    parser.add_argument(
        "--prepare-env",
        action="store_true",
        help="only build the benchmark's environment (once, under a lock) and say where: on a "
        "login node, for compute nodes without the package registry",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="show what would be served and scored, and start nothing",
    )
    parser.add_argument(
        "--tracking-uri",
        default=None,
        metavar="URI",
        help="the MLflow store of the runs (default: the one slca-exp train logs to)",
    )
    parser.add_argument(
        "--out",
        default=str(Path("outputs") / "eval"),
        metavar="DIR",
        help="where each run's server log, driver log and BFCL files are kept, in DIR/<run id> "
        "(default: outputs/eval)",
    )
    parser.add_argument(
        "--config-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of your options (benchmark/NAME.yaml, eval/NAME.yaml)",
    )
    return parser


def _load(overrides: list[str], config_dirs: list[str]):  # noqa: ANN202
    """The benchmark and eval options, the SLURM profile of eval.launcher, every problem."""
    from slca_exp.evaluation.options import load

    benchmark, settings, problems = load(overrides, config_dirs)
    profile = None
    if settings is not None and settings.launcher != "local":
        profile, found = evals.launcher_profile(settings, config_dirs)
        problems += found
    return benchmark, settings, profile, problems


def _eval(args: argparse.Namespace, benchmark, settings, profile) -> int:  # noqa: ANN001
    from mlflow.tracking import MlflowClient

    from slca_exp.evaluation import jobs, scoring
    from slca_exp.tracking.uris import absolute_uri, default_tracking_uri

    uri = absolute_uri(args.tracking_uri) if args.tracking_uri else default_tracking_uri()
    try:
        readback.check_store(uri, explicit=bool(args.tracking_uri))
        client = MlflowClient(tracking_uri=uri)
        label, runs = runs_to_score(client, args.target)
    except (readback.ReadbackError, TargetError) as err:
        print(f"slca-exp eval: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    say(f"{label} in {shown_uri(uri)}: {len(runs)} run(s) to score on {_what(benchmark)}")
    failed, found = 0, []
    folder = Path(args.out).resolve()
    for run in runs:  # every checkpoint checked before anything is served
        try:
            checkpoint = scoring.checkpoint_of(client, run, folder / run.info.run_id)
        except scoring.EvalError as err:
            say(f"run {run.info.run_id}: not scored: {err}")
            failed += 1
            continue
        problems = evals.checkpoint_problems(settings, Path(checkpoint.folder))
        if problems:
            return refuse(problems, f"the eval of run {run.info.run_id}")
        found.append((run, checkpoint))
    if args.dry_run:
        _describe(found, benchmark, settings)
        return EXIT_FAILED if failed else 0
    if profile is not None:
        status = _on_slurm(uri, found, benchmark, settings, profile, folder)
        return status or (EXIT_FAILED if failed else 0)
    say(f"servers' and BFCL's files: {shown_path(folder)}/<run id>")
    for run, checkpoint in found:
        try:
            say(jobs.evaluate_run(client, run, benchmark, settings, folder, say, checkpoint))
        except scoring.EvalError as err:
            say(f"run {run.info.run_id}: not scored: {err}")
            failed += 1
    return EXIT_FAILED if failed else 0


def _on_slurm(uri: str, found, benchmark, settings, profile, folder: Path) -> int:  # noqa: ANN001
    """One SLURM job per run; wait for all of them; 1 if any failed."""
    from slca_exp.evaluation import jobs

    submitted = []
    for run, _ in found:
        job = jobs.EvalJob(uri, run.info.run_id, benchmark, settings, str(folder))
        job = jobs.submit(job, profile, folder / "jobs")
        say(f"run {run.info.run_id}: SLURM job {job.job_id}, log {job.paths.stdout}")
        submitted.append((run, job))
    failed = 0
    for run, job in submitted:
        try:
            say(job.result())
        except Exception as err:  # noqa: BLE001 - submitit re-raises the job's error
            say(f"run {run.info.run_id}: not scored (SLURM job {job.job_id}): {err}")
            failed += 1
    return EXIT_FAILED if failed else 0


class TargetError(Exception):
    """Nothing to score under that name: exit status 2."""


def runs_to_score(client: Any, target: str) -> tuple[str, list[Any]]:  # noqa: ANN401
    """``(label, runs)``: what TARGET names, and its runs that train a policy, oldest first.

    The SFT stage's run of the verl engine (tag ``slca.stage``) is a child of its recipe's run,
    not a job of its own: left out.
    """
    if readback.looks_like_run_id(target):
        run = readback.get_run(client, target)
        if run is not None and run.data.tags.get(ROLE) != PARENT_ROLE:
            return f"run {target}", [run]
    try:
        selection = find_runs(client, target)
        runs = [r for r in selection.runs if STAGE not in r.data.tags]
        return selection.label, runs
    except CompareError as sweep_error:
        try:
            run = readback.find_run(client, target)
        except readback.ReadbackError:
            raise TargetError(str(sweep_error)) from None
        return f"run {run.info.run_id}", [run]


def _what(benchmark) -> str:  # noqa: ANN001
    sample = f"{benchmark.per_category} per category" if benchmark.per_category else "every item"
    n = len(benchmark.categories)
    return f"{benchmark.name} {benchmark.version} ({n} categories, {sample})"


def _describe(found, benchmark, settings) -> None:  # noqa: ANN001
    from slca_exp.evaluation import environment, scoring
    from slca_exp.services.definition import server_command

    env_folder = environment.bfcl_folder(environment.env_root(settings.env_root), benchmark.version)
    env = environment.existing(env_folder)
    print(f"benchmark: {_what(benchmark)}, kind {benchmark.kind}")
    print(f"  categories: {', '.join(benchmark.categories)}")
    print(f"  seed {benchmark.seed}, temperature {benchmark.temperature:g}")
    print(
        f"environment: {shown_path(env_folder)} "
        + ("(built)" if env else "(built on the first eval, once, under a lock)")
    )
    print(f"serving: eval.device={settings.device}, launcher {settings.launcher}")
    for run, checkpoint in found:
        key = scoring.eval_key(benchmark, checkpoint, settings)
        definition = evals.served_checkpoint(settings, checkpoint.folder, checkpoint.served_name)
        line = " ".join(server_command(definition, definition.host, 0)).replace(
            "--port 0", "--port <free>"
        )
        kept = scoring.scored_already(run, benchmark, key) and not settings.rescore
        print(f"run {checkpoint.run_id} ({checkpoint.served_name}), step {checkpoint.step}:")
        print(f"  checkpoint: {checkpoint.folder}")
        print(f"  would serve: {line}")
        print("  scores: " + ("already logged, kept" if kept else "would be scored and logged"))


def say(line: str) -> None:
    """One ``slca-exp eval:`` line on stderr."""
    print(f"slca-exp eval: {line}", file=sys.stderr, flush=True)
