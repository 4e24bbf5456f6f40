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
(``slca_exp/comparability.py``) warns, or with ``--strict`` refuses (exit 2), when runs differ in
a recipe component that was not swept.

For every swept factor with two levels, the difference of each metric between them in every
cell of the other swept factors: n, the mean difference, its 95% interval and p-value (paired t
over the seeds both levels share, else Welch) and a verdict (``slca_exp/compare_stats.py``);
for every numeric factor, a dose-response plot. ``--report OUT.md`` writes all of it, with the
sweep's design, as one markdown page (``slca_exp/report.py``).
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from slca_exp.comparability import differences
from slca_exp.compare_stats import (
    SEED_KEYS,
    Observations,
    effects,
    effects_rows,
    interactions,
    seed_of,
    swept_value,
)
from slca_exp.core.names import METRICS, SEGMENTS, adv, known, val
from slca_exp.core.tags import PARENT_ROLE, ROLE, SWEEP, SWEPT, SWEPT_PREFIX
from slca_exp.effects import MEAN_OVER_STEPS
from slca_exp.tracking import sweep_runs
from slca_exp.tracking.mlflow import mlflow_key
from slca_exp.tracking.sweep_runs import HEADLINE_METRICS
from slca_exp.tracking.text_table import format_table

EFFECTS_NOTE = "paired t over shared seeds, else Welch; 95% intervals"
EXIT_OK = 0
EXIT_REFUSED = 2
DEFAULT_UI_URL = "http://127.0.0.1:5000"
LOWER_IS_BETTER = ("loss", "failures", "latency_ms", "step_s", "no_call", "zeroed_group_frac")
"""A metric whose name contains one of these is best at its minimum; every other at its maximum."""
_VOLATILE_PARAMS = ("run_name",)


class CompareError(Exception):
    """A user-facing error: an unknown target, or a refusal of the guard; exit status 2."""


@dataclass
class Selection:
    """The runs to compare.

    Attributes:
        label: what was found, for messages ("sweep X (parent run Y)" or "experiment X").
        runs: the runs, oldest first.
        swept: the keys the sweep varied (from the parent's ``slca.swept`` tag, or the runs'
            ``slca.swept.<key>`` tags).
        experiment_ids: the experiments the runs live in (for the UI URL).

    """

    label: str
    runs: list[Any]
    swept: list[str]
    experiment_ids: list[str] = field(default_factory=list)


def find_runs(client: Any, target: str) -> Selection:
    """Resolve a sweep id, a parent run id or an experiment name to its runs.

    Raises:
        CompareError: nothing of that name, or it has no runs.

    """
    experiments = client.search_experiments()
    ids = [e.experiment_id for e in experiments]
    parents = sweep_runs.search_all(client, ids, f"tags.`{SWEEP}` = '{_quote(target)}'")
    parents = [p for p in parents if p.data.tags.get(ROLE) == PARENT_ROLE]
    if not parents and _looks_like_run_id(target):
        parents = [run for run in [_get_run(client, target)] if run is not None]
    if parents:
        parent = parents[-1]  # the newest, if a sweep id was reused
        runs = sweep_runs.children(client, parent.info.experiment_id, parent.info.run_id)
        swept = json.loads(parent.data.tags.get(SWEPT, "[]"))
        label = f"sweep {parent.data.tags.get(SWEEP, '?')} (parent run {parent.info.run_id})"
        if not runs:
            raise CompareError(f"{label} has no child runs yet; did its jobs log to MLflow?")
        return Selection(label, runs, swept, [parent.info.experiment_id])
    experiment = next((e for e in experiments if e.name == target), None)
    if experiment is None:
        names = ", ".join(sorted(e.name for e in experiments)) or "(none)"
        raise CompareError(
            f"no sweep id, parent run id or experiment named {target!r} in {client.tracking_uri}. "
            f"Experiments: {names}. Sweep ids are the parent runs' {SWEEP} tags "
            "(pass --tracking-uri if the runs are in another store)."
        )
    runs = [
        run
        for run in sweep_runs.search_all(client, [experiment.experiment_id])
        if run.data.tags.get(ROLE) != PARENT_ROLE
    ]
    if not runs:
        raise CompareError(f"experiment {target!r} has no runs")
    swept = sorted(
        {k[len(SWEPT_PREFIX) :] for r in runs for k in r.data.tags if k.startswith(SWEPT_PREFIX)}
    )
    return Selection(f"experiment {target}", runs, swept, [experiment.experiment_id])


# -- table ----------------------------------------------------------------------------------------


def table(
    client: Any,
    selection: Selection,
    metrics: Sequence[str],
    observe: Observations | None = None,
) -> tuple[list[str], list[list[str]]]:
    """The comparison table: header and rows of text cells.

    One row per run, or per combination of swept values when several runs differ only in seed
    (then each metric cell is ``mean +/- std`` over them, and ``n`` counts them).
    """
    keys = [k for k in selection.swept if k not in SEED_KEYS]
    groups = group_runs(selection)
    per_run = all(len(g) == 1 for g in groups.values())
    header = (["run"] + ([] if keys else ["name"])) if per_run else ["n", "seeds"]
    header += keys
    observe = observe or Observations(client)
    for metric in metrics:
        if metric in MEAN_OVER_STEPS:
            header.append(f"{metric} (mean over steps)")
        else:
            header += [f"{metric} (final)", f"{metric} (best)"]
    rows = []
    for members in groups.values():
        first = members[0]
        if per_run:
            row = [first.info.run_id[:8]] + ([] if keys else [first.info.run_name or ""])
        else:
            seeds = sorted({seed_of(r) for r in members})
            row = [str(len(members)), ",".join(seeds)]
        row += [swept_value(first, k) for k in keys]
        for metric in metrics:
            if metric in MEAN_OVER_STEPS:
                row.append(_cell([observe(r, metric) for r in members]))
                continue
            finals = [r.data.metrics.get(mlflow_key(metric)) for r in members]
            bests = [_best(client, r, metric) for r in members]
            row += [_cell(finals), _cell(bests)]
        rows.append(row)
    return header, rows


def group_runs(selection: Selection) -> dict[tuple, list[Any]]:
    """The runs grouped as the table rows them: by swept values other than the seed.

    Runs that also differ in an unswept param stay apart (the comparability guard names it).
    """
    keys = [k for k in selection.swept if k not in SEED_KEYS]
    groups: dict[tuple, list[Any]] = {}
    for run in selection.runs:
        groups.setdefault(_group_key(run, keys), []).append(run)
    return groups


def _group_key(run: Any, keys: Sequence[str]) -> tuple:
    ignored = set(SEED_KEYS) | set(_VOLATILE_PARAMS)
    params = tuple(sorted((k, v) for k, v in run.data.params.items() if k not in ignored))
    return tuple(swept_value(run, k) for k in keys) + params


def _best(client: Any, run: Any, metric: str) -> float | None:
    key = mlflow_key(metric)
    if key not in run.data.metrics:
        return None
    values = [m.value for m in client.get_metric_history(run.info.run_id, key)]
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return None
    lower = any(word in metric for word in LOWER_IS_BETTER)
    return min(values) if lower else max(values)


def _cell(values: list[float | None]) -> str:
    present = [v for v in values if v is not None and not math.isnan(v)]
    if not present:
        return "-"
    if len(values) == 1:
        return f"{present[0]:.4g}"
    std = statistics.stdev(present) if len(present) > 1 else 0.0
    missing = f" ({len(values) - len(present)} missing)" if len(present) < len(values) else ""
    return f"{statistics.fmean(present):.4g} +/- {std:.2g}{missing}"


def compare_url(ui_url: str, selection: Selection) -> str:
    """The MLflow UI's compare page for the selected runs (query values percent-encoded)."""
    runs = json.dumps([r.info.run_id for r in selection.runs], separators=(",", ":"))
    experiments = json.dumps(selection.experiment_ids, separators=(",", ":"))
    query = f"runs={quote(runs, safe='')}&experiments={quote(experiments, safe='')}"
    return f"{ui_url.rstrip('/')}/#/compare-runs?{query}"


def write_plots(client: Any, selection: Selection, out: Path, *, smooth: float = 0.0) -> list[Path]:
    """``rewards.png`` and ``advantages.png``: per-segment curves, one per group of runs.

    The runs are grouped as the table groups them (:func:`group_runs`): each group is drawn as
    its mean curve with a band of one std over its runs (its seeds), each run smoothed first
    with an EMA of weight ``smooth``; the validation values of a panel's metric are markers.
    """
    from slca_exp.tracking.plots import ADVANTAGE_CURVES, REWARD_CURVES, plot_groups

    figures = {
        "rewards": REWARD_CURVES,
        "advantages": ADVANTAGE_CURVES + tuple(adv(seg, "std") for seg in SEGMENTS),
    }
    wanted = [name for names in figures.values() for name in names]
    wanted += [val(name) for name in wanted]
    groups: dict[str, list[dict[str, list[tuple[int, float]]]]] = {}
    for label, runs in _group_labels(selection).items():
        groups[label] = [
            {
                name: [
                    (m.step, m.value)
                    for m in client.get_metric_history(run.info.run_id, mlflow_key(name))
                ]
                for name in wanted
                if mlflow_key(name) in run.data.metrics
            }
            for run in runs
        ]
    written = []
    for figure, names in figures.items():
        path = plot_groups(
            groups, names, out / f"{figure}.png", title=selection.label, smooth=smooth
        )
        if path is not None:
            written.append(path)
    return written


def write_dose_plots(
    selection: Selection, metrics: Sequence[str], observe: Observations, out: Path
) -> list[Path]:
    """``dose_<factor>.png`` for every numeric swept factor: each metric against its levels."""
    from slca_exp.compare_stats import dose_response, plot_dose_response

    curves = {
        metric: dose_response(selection.runs, selection.swept, metric, observe, swept_value)
        for metric in metrics
    }
    factors = sorted({f for by_factor in curves.values() for f in by_factor})
    written = []
    for factor in factors:
        path = plot_dose_response(
            {m: c for m, c in curves.items() if factor in c},
            factor,
            out / f"dose_{_safe(factor)}.png",
            selection.label,
        )
        if path is not None:
            written.append(path)
    return written


def plural(count: int, noun: str) -> str:
    """``1 run``, ``2 runs``.

    >>> plural(1, "run"), plural(0, "run")
    ('1 run', '0 runs')
    """
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# -- command line ---------------------------------------------------------------------------------


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
        _check_store(uri, explicit=bool(args.tracking_uri))
        client = MlflowClient(tracking_uri=uri)
        selection = find_runs(client, args.target)
    except CompareError as err:
        print(f"slca-exp compare: {err}", file=sys.stderr)
        return EXIT_REFUSED
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
        return EXIT_REFUSED
    metrics = args.metric or [
        m for m in (*HEADLINE_METRICS, *MEAN_OVER_STEPS) if _any_has(selection, m)
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
            return EXIT_REFUSED
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
    out = Path(args.out or Path("outputs") / "compare" / _safe(args.target))
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
        from slca_exp.report import write_report

        report = write_report(
            observe,
            selection,
            _group_labels(selection),
            (header, rows),
            (found, changes),
            plots,
            Path(args.report),
            argv,
        )
        print(f"report: {report}")
    ui = args.ui_url or (uri if uri.startswith(("http://", "https://")) else DEFAULT_UI_URL)
    print(f"MLflow compare page: {compare_url(ui, selection)}")
    return EXIT_OK


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


def _group_labels(selection: Selection) -> dict[str, list[Any]]:
    """A unique legend label -> the runs of one group (:func:`group_runs`).

    The label is the group's swept values other than the seed, with the number of runs when
    there are several; a run alone in its group without swept values is named after its run.
    """
    keys = [k for k in selection.swept if k not in SEED_KEYS]
    labelled: dict[str, list[Any]] = {}
    for runs in group_runs(selection).values():
        first = runs[0]
        text = " ".join(f"{k}={swept_value(first, k)}" for k in keys)
        if len(runs) > 1:
            text = f"{text} (n={len(runs)})".strip()
        text = text or first.info.run_name or ""
        if not text or text in labelled:
            text = f"{text} [{first.info.run_id[:8]}]".strip()
        labelled[text] = runs
    return labelled


def _any_has(selection: Selection, metric: str) -> bool:
    return any(mlflow_key(metric) in r.data.metrics for r in selection.runs)


def _check_store(uri: str, *, explicit: bool) -> None:
    """Refuse a local store that does not exist (MLflow would create an empty one)."""
    from slca_exp.tracking.uris import local_store_path

    db = local_store_path(uri)
    if db is not None and not db.exists():
        how = "" if explicit else " (the default store; set SLCA_EXP_ROOT or pass --tracking-uri)"
        raise CompareError(f"no MLflow store at {db}{how}")


def _get_run(client: Any, run_id: str) -> Any | None:
    try:
        return client.get_run(run_id)
    except Exception:  # not a run id of this store
        return None


def _looks_like_run_id(text: str) -> bool:
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


def _quote(text: str) -> str:
    return text.replace("'", "\\'")


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)
