"""``slca-exp compare``: a table and plots of a sweep's runs, and a comparability guard.

    slca-exp compare EXPERIMENT_OR_SWEEP [--metric M ...] [--strict] [--tracking-uri URI]
                     [--out DIR] [--ui-url URL] [--smooth W] [--report OUT.md]

EXPERIMENT_OR_SWEEP is a sweep id (tag ``slca.sweep``), a sweep's parent run id, or an MLflow
experiment name (all its runs but sweep parents). The table has one row per run, or one per
combination of swept values with mean +/- std over runs that differ only in ``seed``; on the
console it fits :data:`TABLE_WIDTH` columns (long names wrapped), ``table.md`` keeps them whole.
The plots group the runs the same way: one mean curve per group with a band of one std over its
seeds, smoothed with ``--smooth`` (TensorBoard's EMA), validation values as markers. They are
written to ``--out``; the MLflow UI's compare-page URL is printed. The comparability guard
(``slca_exp/analysis/comparability.py``) warns, or with ``--strict`` refuses (exit 2), when runs
differ in a recipe component that was not swept.

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
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from slca_exp.analysis.comparability import differences
from slca_exp.analysis.differences import effects, effects_rows, interactions
from slca_exp.analysis.estimates import MEAN_OVER_STEPS
from slca_exp.analysis.plots import safe_name, write_dose_plots, write_plots
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
    from mlflow.tracking import MlflowClient

    from slca_exp.tracking.uris import default_tracking_uri

    uri = args.tracking_uri or default_tracking_uri()
    try:
        check_store(uri, explicit=bool(args.tracking_uri))
        client = MlflowClient(tracking_uri=uri)
        selection = find_runs(client, args.target)
    except (CompareError, ReadbackError) as err:
        print(f"slca-exp compare: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
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
    found = effects(selection.runs, selection.swept, metrics, observe, swept_value, seed_of)
    if found:
        print(f"\ndifferences between two levels, per cell ({EFFECTS_NOTE}):")
        print(format_table(*effects_rows(found)))
    changes = interactions(selection.runs, selection.swept, metrics, observe, swept_value, seed_of)
    if changes:
        print("\nhow a difference changes along a numeric factor (paired t over seeds):")
        print(format_table(*effects_rows(changes)))
    out = Path(args.out or Path("outputs") / "compare" / safe_name(args.target))
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(sweep_runs.markdown_table(header, rows))
    if found or changes:
        rows_md = effects_rows([*found, *changes])
        (out / "differences.md").write_text(sweep_runs.markdown_table(*rows_md))
    plots = write_plots(client, selection, out, smooth=args.smooth)
    plots += write_dose_plots(selection, metrics, observe, out)
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
        )
        print(f"report: {report}")
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
        "--smooth",
        type=float,
        default=0.0,
        metavar="W",
        help="smooth the plots' curves with an EMA of weight W in [0, 1), as TensorBoard does "
        "(0.6 is its default); default 0: the logged values",
    )
    return parser


def _eval_metrics(selection: Selection) -> list[str]:
    """The benchmark scores (``slca-exp eval``) any of the runs holds, by name."""
    return sorted({k for r in selection.runs for k in r.data.metrics if is_eval_metric(k)})


def _any_has(selection: Selection, metric: str) -> bool:
    return any(mlflow_key(metric) in r.data.metrics for r in selection.runs)
