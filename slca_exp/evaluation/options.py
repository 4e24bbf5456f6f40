"""The ``benchmark`` and ``eval`` options, read from overrides as ``slca-exp eval`` takes them.

``benchmark=NAME``, ``benchmark.KEY=V``, ``eval=NAME`` and ``eval.KEY=V``: each option is
loaded, adjusted and checked field by field (:func:`slca_exp.preflight.options.load_option`),
then as a whole (:func:`~slca_exp.evaluation.benchmark.benchmark_problems`,
:func:`~slca_exp.evaluation.settings.settings_problems`); every problem names its key. A run
with ``eval.after_train=true`` is checked the same way before it starts (:func:`after_train`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slca_exp.core.problems import Problem
from slca_exp.evaluation import benchmark as benchmarks
from slca_exp.evaluation import settings as evals
from slca_exp.preflight.options import load_option


def load(
    overrides: Sequence[str],
    config_dirs: Sequence[str] = (),
    *,
    benchmark: str = benchmarks.DEFAULT,
    serving: str = evals.DEFAULT,
) -> tuple[benchmarks.Benchmark | None, evals.EvalSettings | None, list[Problem]]:
    """The benchmark and eval options the overrides pick and adjust, and every problem."""
    names = {benchmarks.GROUP: benchmark, evals.GROUP: serving}
    picked: dict[str, list[str]] = {benchmarks.GROUP: [], evals.GROUP: []}
    problems: list[Problem] = []
    for override in overrides:
        key, sep, value = override.partition("=")
        group = key.split(".", 1)[0]
        if not sep or group not in names:
            problems.append(
                Problem(
                    key if sep else override,
                    "is not an argument of `slca-exp eval`",
                    "give benchmark=NAME, benchmark.KEY=V, eval=NAME or eval.KEY=V",
                )
            )
        elif key == group:
            names[group] = value
        else:
            picked[group].append(override)
    found_benchmark, found = load_option(
        benchmarks.GROUP,
        benchmarks.Benchmark,
        names[benchmarks.GROUP],
        picked[benchmarks.GROUP],
        config_dirs,
    )
    problems += found
    if found_benchmark is not None:
        found_benchmark.name = found_benchmark.name or names[benchmarks.GROUP]
        problems += benchmarks.benchmark_problems(found_benchmark)
    settings, found = load_option(
        evals.GROUP, evals.EvalSettings, names[evals.GROUP], picked[evals.GROUP], config_dirs
    )
    problems += found
    if settings is not None:
        problems += evals.settings_problems(settings)
    return found_benchmark, settings, problems


def after_train(config: Any) -> tuple[Any, Any, list[Problem]]:  # noqa: ANN401 - a RunConfig
    """A run's ``eval`` section: its benchmark and settings, and every problem, keyed ``eval.*``.

    Nothing is loaded when ``eval.after_train`` is false. The eval runs in the training job, on
    the run's own MLflow run: ``eval.launcher`` must stay local and MLflow must be on.
    """
    section = config.eval
    if not section.after_train:
        return None, None, []
    benchmark, settings, found = load(
        section.overrides, benchmark=section.benchmark, serving=section.serving
    )
    problems = [_in_section(p, section) for p in found]
    if benchmark is not None and benchmark.kind != "bfcl":
        problems.append(
            Problem("eval.benchmark", benchmarks.TAU2_UNAVAILABLE, "pick benchmark bfcl_v3")
        )
    if settings is not None and settings.launcher != "local":
        problems.append(
            Problem(
                "eval.overrides",
                f"eval.launcher={settings.launcher}: after training, the eval runs in the "
                "training job itself, on its resources",
                "drop eval.launcher, or score later: slca-exp eval RUN eval.launcher=<profile>",
            )
        )
    if "mlflow" not in config.tracking.backends:
        problems.append(
            Problem(
                "eval.after_train",
                "the scores go into the run's MLflow run, and tracking.backends has no mlflow",
                "use tracking=mlflow (or mlflow_wandb), or set eval.after_train=false",
            )
        )
    return benchmark, settings, problems


def _in_section(problem: Problem, section: Any) -> Problem:  # noqa: ANN401
    """A problem of the options, keyed by the run's ``eval`` section key that set it."""
    fix = problem.fix.replace("eval=", "eval.serving=").replace("benchmark=", "eval.benchmark=")
    key = problem.key
    if key in (benchmarks.GROUP, evals.GROUP):
        where = "eval.benchmark" if key == benchmarks.GROUP else "eval.serving"
        return Problem(where, problem.what, fix)
    overridden = {o.partition("=")[0] for o in section.overrides}
    if key in overridden or not key.startswith((f"{benchmarks.GROUP}.", f"{evals.GROUP}.")):
        where = "eval.overrides"
    else:
        where = "eval.benchmark" if key.startswith(benchmarks.GROUP) else "eval.serving"
    return Problem(f"{where} ({key})", problem.what, fix)
