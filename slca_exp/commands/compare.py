"""``slca-exp compare``: a table and plots of a sweep's runs, and a comparability guard.

    slca-exp compare EXPERIMENT_OR_SWEEP [--metric M ...] [--strict] [--tracking-uri URI]
                     [--out DIR] [--ui-url URL] [--smooth W] [--report OUT.md]
                     [--margin M] [--variance] [--save-study FILE.json.gz]

EXPERIMENT_OR_SWEEP is a sweep id (tag ``slca.sweep``), a sweep's parent run id, an MLflow
experiment name (all its runs but sweep parents), or a study file that ``--save-study`` wrote
(``slca_exp/analysis/study_file.py``: what compare reads of a sweep, without its store). The
table has one row per run, or one per combination of swept values with mean +/- std over runs
that differ only in ``seed``; on the console it fits :data:`TABLE_WIDTH` columns (long names
wrapped), ``table.md`` keeps them whole. The plots group the runs the same way: one mean curve
per group with a band of one std over its seeds, smoothed with ``--smooth`` (TensorBoard's EMA),
validation values as markers. They are written to ``--out``; the MLflow UI's compare-page URL is
printed. The comparability guard (``slca_exp/analysis/comparability.py``) warns, or with
``--strict`` refuses (exit 2), when runs differ in a recipe component that was not swept.

For every swept factor with two levels, the difference of each metric between them in every
cell of the other swept factors: n, the mean difference, its 95% interval and p-value (paired t
over the seeds both levels share, else Welch) and a verdict (``slca_exp/analysis/differences.py``);
for every numeric factor, a dose-response plot. ``--report OUT.md`` writes all of it, with the
sweep's design, as one markdown page (``slca_exp/analysis/report.py``).

Benchmark scores (``eval/<benchmark>/<category>``, written into the runs by ``slca-exp eval``)
are metrics like any other: without ``--metric`` every one the runs hold is tabulated and
differenced, and the report gives them a section of their own.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slca_exp.analysis.comparability import differences
from slca_exp.analysis.differences import effects, effects_rows, interactions, interval_rows
from slca_exp.analysis.estimates import MEAN_OVER_STEPS
from slca_exp.analysis.plots import safe_name, write_dose_plots, write_plots, write_profiles
from slca_exp.analysis.report import write_report
from slca_exp.analysis.runs import (
    CompareError,
    Observations,
    Selection,
    compare_url,
    find_runs,
    group_labels,
    seed_of,
    swept_value,
)
from slca_exp.analysis.tables import format_table, plural, table
from slca_exp.core.names import METRICS, is_eval_metric, known
from slca_exp.core.problems import EXIT_BAD_CONFIG
from slca_exp.tracking import sweep_runs
from slca_exp.tracking.mlflow import mlflow_key
from slca_exp.tracking.readback import ReadbackError, check_store
from slca_exp.tracking.sweep_runs import HEADLINE_METRICS

EFFECTS_NOTE = "paired t over shared seeds, else Welch; 95% intervals"
INTERVALS_NOTE = (
    "95% percentile bootstrap over runs, each level resampled on its own, pairs of one seed "
    "together; diff: paired over seeds, else of the two levels' statistics"
)
DEFAULT_UI_URL = "http://127.0.0.1:5000"


def main(argv: Sequence[str]) -> int:
    """Run ``slca-exp compare``; returns the exit status (0, or 2 for an error or a refusal)."""
    parser = _parser()
    args = parser.parse_args(list(argv))
    if not 0.0 <= args.smooth < 1.0:
        parser.error(
            f"--smooth {args.smooth} is outside [0, 1): it is the EMA weight of the plots' "
            "curves (0 = none, 0.6 = TensorBoard's default, 0.9 = strong)"
        )
    from slca_exp.analysis.study_file import SUFFIX, StudyFileError, opened_study
    from slca_exp.tracking.uris import default_tracking_uri

    if args.save_study and not args.save_study.endswith(SUFFIX):
        parser.error(f"--save-study {args.save_study}: a study file's name ends with {SUFFIX}")

    if args.target.endswith(SUFFIX):
        if not Path(args.target).is_file():
            print(f"slca-exp compare: no study file at {args.target}", file=sys.stderr)
            return EXIT_BAD_CONFIG
        if args.tracking_uri:
            parser.error(
                f"--tracking-uri with the study file {args.target}: a study file is its own "
                "store (compare loads it into a temporary one); leave out --tracking-uri"
            )
        try:
            with opened_study(Path(args.target)) as (uri, target):
                return _compare(args, argv, uri, target, study_file=True)
        except StudyFileError as err:
            print(f"slca-exp compare: {err}", file=sys.stderr)
            return EXIT_BAD_CONFIG
    uri = args.tracking_uri or default_tracking_uri()
    try:
        check_store(uri, explicit=bool(args.tracking_uri))
    except ReadbackError as err:
        print(f"slca-exp compare: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    return _compare(args, argv, uri, args.target, study_file=False)


def _compare(
    args: argparse.Namespace, argv: Sequence[str], uri: str, target: str, *, study_file: bool
) -> int:
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri)
        selection = find_runs(client, target)
    except (CompareError, ReadbackError) as err:
        print(f"slca-exp compare: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    unfinished = [r for r in selection.runs if r.info.status != "FINISHED"]
    if unfinished and len(unfinished) < len(selection.runs):
        # a sweep part-way (interrupted, or still running): its unfinished runs have no final
        # values yet, and a job's run is tagged with its swept values only when the job ends
        ids = ", ".join(f"{r.info.run_id} ({r.info.status})" for r in unfinished)
        print(
            f"slca-exp compare: leaving out {len(unfinished)} run(s) that did not finish: {ids}",
            file=sys.stderr,
        )
        selection.runs = [r for r in selection.runs if r.info.status == "FINISHED"]
    problems = differences(client, selection.runs, selection.swept)
    for problem in problems:
        level = "error" if args.strict else "warning"
        print(f"slca-exp compare: {level}: {problem.message()}", file=sys.stderr)
    if problems and args.strict:
        names = ", ".join(p.component for p in problems)
        print(
            f"slca-exp compare: refusing to compare (--strict): the runs differ in {names}, "
            "which the sweep did not vary. Compare runs that share it, or sweep it explicitly.",
            file=sys.stderr,
        )
        return EXIT_BAD_CONFIG
    metrics = args.metric or [
        *(m for m in (*HEADLINE_METRICS, *MEAN_OVER_STEPS) if _any_has(selection, m)),
        *_eval_metrics(selection),
    ]
    for metric in metrics:
        if _any_has(selection, metric):
            continue
        if not known(metric):
            close = difflib.get_close_matches(metric, list(METRICS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            print(
                f"slca-exp compare: --metric {metric!r} is not a metric slca-exp logs.{hint} "
                "The names are listed in docs/metrics.md (defined in slca_exp/core/names.py).",
                file=sys.stderr,
            )
            return EXIT_BAD_CONFIG
        print(f"slca-exp compare: warning: no run logged {metric!r}", file=sys.stderr)
    observe = Observations(client)  # one read of each run's metric history
    header, rows = table(client, selection, metrics, observe)
    swept = ", ".join(selection.swept) or "-"
    print(f"{selection.label}: {plural(len(selection.runs), 'run')}; swept: {swept}")
    print(format_table(header, rows))
    try:
        margin = args.margin if args.margin is not None else study_margin(client, selection)
    except CompareError as err:
        print(f"slca-exp compare: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    found = effects(selection.runs, selection.swept, metrics, observe, swept_value, seed_of)
    intervals = None
    if found:
        note = EFFECTS_NOTE + (f"; TOST within ±{margin:g}" if margin is not None else "")
        print(f"\ndifferences between two levels, per cell ({note}):")
        print(format_table(*effects_rows(found, margin)))
        print(f"\ninterval estimates per cell ({INTERVALS_NOTE}):")
        intervals = interval_rows(found, margin)  # bootstrapped once: printed, written, reported
        print(format_table(*intervals))
    changes = interactions(selection.runs, selection.swept, metrics, observe, swept_value, seed_of)
    if changes:
        print("\nhow a difference changes along a numeric factor (paired t over seeds):")
        print(format_table(*effects_rows(changes, margin)))
    split = variance_split(observe, selection, found, margin) if args.variance else None
    name = Path(args.target).name.removesuffix(".json.gz") if study_file else args.target
    out = Path(args.out or Path("outputs") / "compare" / safe_name(name))
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(sweep_runs.markdown_table(header, rows))
    if found or changes:
        rows_md = effects_rows([*found, *changes], margin)
        (out / "differences.md").write_text(sweep_runs.markdown_table(*rows_md))
        if intervals is not None:
            (out / "intervals.md").write_text(sweep_runs.markdown_table(*intervals))
    plots = write_plots(client, selection, out, smooth=args.smooth)
    plots += write_dose_plots(selection, metrics, observe, out)
    plots += write_profiles(selection, metrics, observe, out)
    for path in plots:
        print(f"plot: {path}")
    print(f"table: {out / 'table.md'}")
    if found:
        print(f"differences: {out / 'differences.md'}")
    if args.report:
        report = write_report(
            observe,
            selection,
            group_labels(selection),
            (header, rows),
            (found, changes),
            plots,
            Path(args.report),
            argv,
            margin=margin,
            intervals=intervals,
            split=split,
        )
        print(f"report: {report}")
    if args.save_study:
        from slca_exp.analysis.report import sweep_parent
        from slca_exp.analysis.study_file import save_study

        parent = sweep_parent(client, selection.runs)
        saved = save_study(observe, parent, selection.runs, metrics, Path(args.save_study))
        size = saved.stat().st_size / 1024
        print(f"study file: {saved} ({plural(len(selection.runs), 'run')}, {size:.0f} KiB)")
    if study_file:  # its store is temporary: no MLflow UI shows it
        return 0
    ui = args.ui_url or (uri if uri.startswith(("http://", "https://")) else DEFAULT_UI_URL)
    print(f"MLflow compare page: {compare_url(ui, selection)}")
    return 0


def _parser() -> argparse.ArgumentParser:
    # Plain text: the module docstring's markup would reach the terminal as it is.
    parser = argparse.ArgumentParser(
        prog="slca-exp compare",
        description="A table and plots of a sweep's runs, and a comparability guard. "
        "EXPERIMENT_OR_SWEEP is a sweep id, a sweep's parent run id, or an MLflow experiment "
        "name (all its runs but sweep parents); runs that differ only in seed are one row, "
        "mean +/- std. For a factor swept over two levels, the difference per cell of the "
        "other factors: 95% interval, p-value (paired t over shared seeds, else Welch), verdict.",
    )
    parser.add_argument(
        "target", metavar="EXPERIMENT_OR_SWEEP", help="sweep id, parent run id or experiment name"
    )
    parser.add_argument(
        "--metric",
        action="append",
        metavar="M",
        help="metric to tabulate (repeatable); default: headline rewards",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse (exit 2) when runs differ in an unswept recipe component",
    )
    parser.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="MLflow tracking URI; default: the store slca-exp train logs to",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="folder for plots and table.md; default outputs/compare/<target>",
    )
    parser.add_argument(
        "--ui-url",
        metavar="URL",
        default=os.environ.get("SLCA_EXP_MLFLOW_UI"),
        help="MLflow UI base URL for the compare link; default $SLCA_EXP_MLFLOW_UI, the "
        f"tracking server, or {DEFAULT_UI_URL}",
    )
    parser.add_argument(
        "--report",
        metavar="OUT.md",
        help="also write a report: the sweep's design, the table, the differences with their "
        "intervals, the plots (copied beside it) and the grad-cosine summary",
    )
    parser.add_argument(
        "--margin",
        type=_positive,
        metavar="M",
        help="equivalence margin: adds a TOST per cell (is |b - a| < M?) and its verdict "
        "'equivalent within ±M'; default: the study's margin, if it states one",
    )
    parser.add_argument(
        "--variance",
        action="store_true",
        help="split each validation reward difference's spread over seeds into evaluation "
        "noise and training noise, and say how many validation rows and seeds reach a verdict",
    )
    parser.add_argument(
        "--save-study",
        metavar="FILE.json.gz",
        help="also write what compare read (runs, tags, the compared metrics' histories, final "
        "validation rewards) to a study file, which slca-exp compare FILE.json.gz compares "
        "again without the MLflow store",
    )
    parser.add_argument(
        "--smooth",
        type=float,
        default=0.0,
        metavar="W",
        help="smooth the plots' curves with an EMA of weight W in [0, 1), as TensorBoard does "
        "(0.6 is its default); default 0: the logged values",
    )
    return parser


def _positive(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number (the margin M > 0)")
    return value


def _eval_metrics(selection: Selection) -> list[str]:
    """The benchmark scores (``slca-exp eval``) any of the runs holds, by name."""
    return sorted({k for r in selection.runs for k in r.data.metrics if is_eval_metric(k)})


def _any_has(selection: Selection, metric: str) -> bool:
    return any(mlflow_key(metric) in r.data.metrics for r in selection.runs)


def study_margin(client: Any, selection: Selection) -> float | None:  # noqa: ANN401
    """The equivalence margin the sweep's study file states (``margin:``), if any."""
    from slca_exp.analysis.report import sweep_parent
    from slca_exp.core import tags
    from slca_exp.launch.command import study_notes

    parent = sweep_parent(client, selection.runs)
    study = parent.data.tags.get(tags.STUDY) if parent is not None else None
    text = study_notes(study).get("margin") if study else None
    if text is None:
        return None
    try:
        return _positive(text)
    except (ValueError, argparse.ArgumentTypeError) as err:
        raise CompareError(f"study {study}: margin: {err}") from err


def variance_split(
    observe: Observations, selection: Selection, found: Sequence[Any], margin: float | None
) -> Any:  # noqa: ANN401
    """``--variance``: print each paired validation difference's split; returns the splits."""
    from slca_exp.analysis.variance import split_rows, splits

    def runs_of(effect: Any, seed: str) -> tuple[Any, Any]:  # noqa: ANN401
        def run(level: str) -> Any:  # noqa: ANN401
            return next(
                r
                for r in selection.runs
                if seed_of(r) == seed
                and swept_value(r, effect.factor) == level
                and all(swept_value(r, k) == v for k, v in effect.cell)
            )

        return run(effect.levels[0]), run(effect.levels[1])

    got, missing = splits(observe, found, runs_of)
    if got:
        print("\nthe spread of each difference over seeds: evaluation noise and training noise")
        print(format_table(*split_rows(got, margin)))
    for line in missing:
        print(f"slca-exp compare: no variance split: {line}", file=sys.stderr)
    return got
