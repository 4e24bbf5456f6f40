"""``slca-exp compare SWEEP --report OUT.md``: a sweep's results as one markdown page.

The page is written from the store alone, so that no number in it is typed by hand:

- how it was made: the command, the date, the commit(s) the runs ran, the sweep's wall time (its
  parent run's start to end, else its first run's start to its last run's end), the runs;
- the design: the swept keys and their values, the overrides every job shared, the recipe
  components, and for a ready study (``sweep=<name>``, tag ``slca.study``) the question, design
  and expected outcome its file states (written before the runs);
- the table of :func:`slca_exp.analysis.tables.table`, the differences of
  :func:`slca_exp.analysis.differences.effects` with their verdicts and, where nothing
  separates, the seeds the measured variance would need;
- the gradient conflict (``train/grad_cos`` and the two segment gradient norms, each a mean over
  steps) per group, when logged;
- the validation prompts that moved most between the two algorithms of the sweep, from the runs'
  logged rollouts (:mod:`slca_exp.analysis.prompts`);
- the benchmark scores (``eval/<benchmark>/<category>``, ``slca-exp eval``) per group, when
  the runs were scored, with each benchmark's version and sample;
- the plots, copied into ``<OUT stem>_files/`` beside the page.
"""

from __future__ import annotations

import math
import shlex
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slca_exp.analysis.differences import (
    Effect,
    effect_tost,
    effects_rows,
    interval_rows,
    levels,
)
from slca_exp.analysis.estimates import CONFIDENCE, mean_interval
from slca_exp.analysis.runs import Observations, Selection, seed_of, swept_value
from slca_exp.core import names, tags
from slca_exp.recipe import COMPONENTS

GRAD_COS = names.TRAIN_GRAD_COS


def write_report(
    observe: Observations,
    selection: Selection,
    groups: Mapping[str, Sequence[Any]],
    table: tuple[Sequence[str], Sequence[Sequence[str]]],
    differences: tuple[Sequence[Effect], Sequence[Effect]],
    plots: Sequence[Path],
    out: Path,
    argv: Sequence[str],
    *,
    margin: float | None = None,
    intervals: tuple[Sequence[str], Sequence[Sequence[str]]] | None = None,
    split: Sequence[Any] | None = None,
) -> Path:
    """Write the report to ``out`` (and its plots beside it); returns ``out``.

    Args:
        observe: the runs' observations (:class:`~slca_exp.analysis.runs.Observations`).
        selection: the runs compare selected (its ``label``, ``runs`` and ``swept`` keys).
        groups: legend label -> the runs of one group, as compare's table and plots group them.
        table: compare's table (header, rows).
        differences: the differences per cell (:func:`~slca_exp.analysis.differences.effects`)
            and how they change along a numeric factor
            (:func:`~slca_exp.analysis.differences.interactions`).
        plots: the plots compare wrote; copied beside the report.
        out: the report's path.
        argv: compare's command line, quoted in the report.
        margin: the equivalence margin (``--margin``, or the study's): a TOST per cell.
        intervals: the interval estimates of ``differences``' cells
            (:func:`~slca_exp.analysis.differences.interval_rows`), when compare made them.
        split: the variance splits (``--variance``), if computed.

    """
    from slca_exp.tracking.sweep_runs import markdown_table

    header, rows = table
    found, changes = differences

    out.parent.mkdir(parents=True, exist_ok=True)
    files = out.parent / f"{out.stem}_files"
    files.mkdir(exist_ok=True)
    runs = selection.runs
    parent = sweep_parent(observe.client, runs)
    study = parent.data.tags.get(tags.STUDY) if parent is not None else None
    title = f"Study `{study}`" if study else selection.label
    lines = [f"# {title}", ""]
    lines += _provenance(selection, parent, argv)
    lines += ["", "## Design", ""]
    notes = _notes(study) if study else {}
    if notes:
        for key, heading in (("question", "Question"), ("design", "Why this recipe")):
            if key in notes:
                lines += [f"**{heading}.** {notes[key]}", ""]
    for key in selection.swept:
        values = levels(runs, key, swept_value)
        lines.append(f"- swept `{key}`: {', '.join(f'`{v}`' for v in values)}")
    shared = _shared_overrides(runs, selection.swept)
    if shared:
        lines.append(f"- every job: `{' '.join(shared)}`")
    first = runs[0].data.tags
    for component in COMPONENTS:
        label = first.get(tags.COMPONENT_TAGS[component])
        if label:
            lines.append(f"- {component}: `{label}`")
    if "expected" in notes:
        lines += ["", "## Expected outcome (stated before the runs)", "", notes["expected"]]
    lines += ["", "## Results", "", f"Final values over the runs of each group ({_seeds(runs)}):"]
    lines += ["", markdown_table(header, rows)]
    if found:
        lines += [
            "## Differences",
            "",
            f"For each factor with two levels, in each cell of the other factors: the mean "
            f"difference, its {CONFIDENCE:.0%} interval and p-value (paired t over the seeds both "
            "levels share, else Welch's t).",
            "",
            markdown_table(*effects_rows(found, margin)),
        ]
        if margin is not None:
            lines += [
                f"Equivalence margin ±{margin:g}"
                + (" (the study's, stated before the runs)" if "margin" in notes else "")
                + ": two one-sided t tests per cell (TOST, 5% each); `equivalent within "
                f"±{margin:g}` when the 90% interval of the difference lies inside the margin.",
                "",
            ]
        lines += _reading(found, margin)
        lines += [
            "",
            "## Interval estimates",
            "",
            "Per cell, each level's interquartile mean (IQM) and mean, their differences and the "
            "probability of improvement P(b > a) (each run of b against each run of a, ties "
            f"half), with {CONFIDENCE:.0%} percentile bootstrap intervals over runs (each level "
            "resampled on its own, the two runs of a seed together; scipy's bootstrap, "
            "10,000 resamples from a fixed seed):",
            "",
            markdown_table(*(intervals or interval_rows(found, margin))),
        ]
    if split:
        from slca_exp.analysis.variance import split_rows

        lines += [
            "",
            "## Evaluation noise and training noise",
            "",
            "Each validation reward difference's variance over seeds, taken apart: the part the "
            "choice of validation prompts gives (from each seed's per-prompt differences), and "
            "the rest, which only more seeds reduce; then the seeds each validation size would "
            "need (80% power):",
            "",
            markdown_table(*split_rows(split, margin)),
        ]
    if changes:
        lines += [
            "",
            "## Does the difference change along the numeric factor?",
            "",
            "Per seed, the difference at the factor's highest level minus the one at its lowest "
            "(paired t over the seeds that ran all four jobs):",
            "",
            markdown_table(*effects_rows(changes, margin)),
        ]
        lines += _reading(changes, margin)
    cos = _grad_cos(observe, groups)
    if cos:
        lines += ["", "## Gradient conflict", ""]
        lines += [
            "cos(grad of the tool-token loss, grad of the summary-token loss) at each step "
            f"(`engine.rl.grad_cos`), averaged over each run's steps; mean over the group's "
            f"runs and its {CONFIDENCE:.0%} interval, and the two gradients' norms, averaged "
            "the same way:",
            "",
            markdown_table(
                [
                    "group",
                    "runs",
                    "mean cos",
                    f"{CONFIDENCE:.0%} CI",
                    "norm of g_tool",
                    "norm of g_summary",
                ],
                cos,
            ),
        ]
    lines += _moved_section(observe, selection)
    lines += _benchmark_section(observe, runs, groups)
    if plots:
        lines += ["", "## Plots", ""]
        for plot in plots:
            copied = files / plot.name
            if plot.resolve() != copied.resolve():
                shutil.copyfile(plot, copied)
            lines += [f"![{plot.stem}]({files.name}/{plot.name})", ""]
    out.write_text("\n".join(lines).rstrip() + "\n")
    return out


def _moved_section(observe: Observations, selection: Selection) -> list[str]:
    """The validation prompts that moved most between the sweep's two algorithms."""
    from slca_exp.analysis.prompts import SHOWN, moved_prompts, moved_rows
    from slca_exp.tracking.sweep_runs import markdown_table

    found = moved_prompts(observe, selection.runs, selection.swept)
    if found is None:
        return []
    algorithms, moved = found
    return [
        "",
        "## The prompts that moved most",
        "",
        f"Each run's last logged validation rollouts, paired by prompt with the run of the other "
        f"algorithm that shares its seed and every other swept value; means over those pairs, "
        f"the {min(SHOWN, len(moved))} prompts (of {len(moved)}) whose total changed most "
        f"(`slca-exp rollouts RUN_A --against RUN_B --val` shows one pair in full):",
        "",
        markdown_table(*moved_rows(algorithms, moved)),
    ]


def _notes(study: str) -> dict[str, str]:
    from slca_exp.launch.command import study_notes

    return study_notes(study)


def _provenance(selection: Selection, parent: Any, argv: Sequence[str]) -> list[str]:  # noqa: ANN401
    runs = selection.runs
    commits = sorted({r.data.tags.get(tags.GIT_COMMIT, "") for r in runs} - {""})
    start, end = _span(parent, runs)
    statuses: dict[str, int] = {}
    for run in runs:
        statuses[run.info.status] = statuses.get(run.info.status, 0) + 1
    made = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    wall = f"{(end - start) / 60000:.1f} min" if start and end and end >= start else "unknown"
    return [
        f"Written by `slca-exp compare {shlex.join(argv)}` on {made}.",
        "",
        "| | |",
        "| --- | --- |",
        f"| sweep | {selection.label} |",
        f"| commit | {', '.join(f'`{c[:12]}`' for c in commits) or 'not recorded'} |",
        f"| wall time | {wall} |",
        f"| runs | {', '.join(f'{n} {s}' for s, n in sorted(statuses.items()))} |",
    ]


def sweep_parent(client: Any, runs: Sequence[Any]) -> Any | None:  # noqa: ANN401
    """The parent run all of ``runs`` share, or ``None`` (none, several, or deleted)."""
    ids = {r.data.tags.get(tags.PARENT_RUN) for r in runs} - {None}
    if len(ids) != 1:
        return None
    try:
        return client.get_run(ids.pop())
    except Exception:  # the parent was deleted
        return None


def _span(parent: Any, runs: Sequence[Any]) -> tuple[int | None, int | None]:  # noqa: ANN401
    if parent is not None and parent.info.end_time:
        return parent.info.start_time, parent.info.end_time
    starts = [r.info.start_time for r in runs if r.info.start_time]
    ends = [r.info.end_time for r in runs if r.info.end_time]
    return (min(starts) if starts else None), (max(ends) if ends else None)


def _shared_overrides(runs: Sequence[Any], swept: Sequence[str]) -> list[str]:
    """The overrides every job was given, the swept keys left out."""
    lists = [r.data.tags.get(tags.OVERRIDES, "").split() for r in runs]
    if not lists or not all(lists):
        return []
    common = [o for o in lists[0] if all(o in other for other in lists[1:])]
    return [o for o in common if o.split("=", 1)[0].lstrip("+~") not in swept]


def _seeds(runs: Sequence[Any]) -> str:
    seeds = sorted({seed_of(r) for r in runs}, key=lambda s: (len(s), s))
    return f"seeds {', '.join(seeds)}" if seeds else "one run each"


def _reading(found: Sequence[Effect], margin: float | None) -> list[str]:
    """One line per difference: its verdict in words (the table's), with the seeds it would need."""
    out = ["", "Read plainly:", ""]
    for e in found:
        est = e.estimate
        where = f" at {e.cell_label}" if e.cell else ""
        weighed = None
        if margin is not None and not est.identical and not math.isnan(est.low):
            weighed = effect_tost(e, margin)
        if est.identical:
            text = "every pair is identical"
        elif est.separated:
            text = (
                f"differs by {est.mean:+.4g} ({CONFIDENCE:.0%} CI [{est.low:+.4g}, "
                f"{est.high:+.4g}], p={est.p:.3g})"
            )
            if weighed is not None and weighed.equivalent:
                text += f", and lies within ±{margin:g} (TOST p={weighed.p:.3g})"
        elif math.isnan(est.low):
            text = "too few runs for an interval"
        elif weighed is not None and weighed.equivalent:
            text = (
                f"equivalent within ±{margin:g}: the 90% interval of the difference "
                f"[{weighed.low:+.4g}, {weighed.high:+.4g}] lies inside the margin (mean "
                f"{est.mean:+.4g}, TOST p={weighed.p:.3g})"
            )
        else:
            text = f"not separated at n={est.n} (mean {est.mean:+.4g}, p={est.p:.3g})"
            if est.needed is not None:
                text += (
                    f"; the measured variance would need about {est.needed} seeds per level "
                    "to separate this difference at 80% power"
                )
            if weighed is not None:
                text += (
                    f", and about {weighed.needed} to show it within ±{margin:g}"
                    if weighed.needed
                    else f"; equivalence within ±{margin:g} is not reachable as measured"
                )
        out.append(f"- `{e.metric}`, {e.label}{where}: {text}.")
    return out


def _benchmark_section(
    observe: Observations,
    runs: Sequence[Any],
    groups: Mapping[str, Sequence[Any]],
) -> list[str]:
    """The runs' benchmark scores (``slca-exp eval``), per group: mean and interval over runs."""
    from slca_exp.tracking.sweep_runs import markdown_table

    found = sorted({k for r in runs for k in r.data.metrics if names.is_eval_metric(k)})
    if not found:
        return []
    lines = [
        "",
        "## Benchmark scores",
        "",
        "Each run's final checkpoint scored by `slca-exp eval` (the benchmark's own checker); "
        f"mean over the group's runs and its {CONFIDENCE:.0%} interval.",
        "",
    ]
    for benchmark in sorted({k.split("/")[1] for k in found}):
        scored = [r for r in runs if tags.eval_tag(benchmark, "version") in r.data.tags]
        sources = sorted(
            {
                " ".join(
                    f"{field} `{r.data.tags.get(tags.eval_tag(benchmark, field), '-')}`"
                    for field in ("version", "per_category", "seed")
                )
                for r in scored
            }
        )
        counted = f"{len(scored)} of {len(runs)} runs scored"
        lines.append(f"- {benchmark}: {counted}; {'; '.join(sources)}")
    rows = [[metric, *row] for metric in found for row in _per_group(observe, groups, metric, "")]
    header = ["metric", "group", "runs", "mean", f"{CONFIDENCE:.0%} CI"]
    return [*lines, "", markdown_table(header, rows)]


def _grad_cos(observe: Observations, groups: Mapping[str, Sequence[Any]]) -> list[list[str]]:
    """Per group: the cosine's row of :func:`_per_group`, then each norm's mean over the runs."""
    rows = []
    for row in _per_group(observe, groups, GRAD_COS, "+"):
        runs = groups[row[0]]
        for norm in (names.TRAIN_GRAD_NORM_TOOL, names.TRAIN_GRAD_NORM_SUMMARY):
            values = [v for v in (observe(r, norm) for r in runs) if v is not None]
            row.append(f"{sum(values) / len(values):.3g}" if values else "-")
        rows.append(row)
    return rows


def _per_group(
    observe: Observations, groups: Mapping[str, Sequence[Any]], metric: str, sign: str
) -> list[list[str]]:
    """Per group that logged ``metric``: its label, runs, mean and interval (``sign``: ``+``)."""
    rows = []
    for label, runs in groups.items():
        values = [v for v in (observe(r, metric) for r in runs) if v is not None]
        if not values:
            continue
        mean, low, high = mean_interval(values)
        interval = "-" if math.isnan(low) else f"[{low:{sign}.3f}, {high:{sign}.3f}]"
        rows.append([label, str(len(values)), f"{mean:{sign}.3f}", interval])
    return rows
