"""``slca-exp compare``'s table: one row per run, or per group of runs that differ in the seed.

On the console it is laid out by rich within :data:`TABLE_WIDTH` columns, long names wrapped by
textwrap (:func:`format_table`); ``table.md`` keeps them whole.
"""

from __future__ import annotations

import math
import re
import statistics
import textwrap
from collections.abc import Sequence
from typing import Any

from rich.box import Box

from slca_exp.analysis.estimates import MEAN_OVER_STEPS
from slca_exp.analysis.runs import (
    SEED_KEYS,
    Observations,
    Selection,
    group_runs,
    seed_of,
    shown_id,
    swept_value,
)
from slca_exp.tracking.mlflow import mlflow_key

LOWER_IS_BETTER = ("loss", "failures", "latency_ms", "step_s", "no_call", "zeroed_group_frac")
"""A metric whose name contains one of these is best at its minimum; every other at its maximum."""


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
            row = [shown_id(first)[:8]] + ([] if keys else [first.info.run_name or ""])
        else:
            seeds = sorted({seed_of(r) for r in members}, key=lambda s: (len(s), s))
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


def plural(count: int, noun: str) -> str:
    """``1 run``, ``2 runs``.

    >>> plural(1, "run"), plural(0, "run")
    ('1 run', '0 runs')
    """
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


TABLE_WIDTH = 120
"""The console table's width: long names wrap onto several lines to stay within it."""
_MIN_COLUMN = 6
_RULED = Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)
"""A rule under the header, nothing else (rich's SIMPLE_HEAD, in ASCII)."""


_BREAKS = re.compile(r"(\s+|(?<=[/._])(?=[A-Za-z]))")
"""Where a cell may break: at spaces, and after ``/ . _`` before a letter (``reward/tool``,
``tool_weights``), so that ``+/-`` and numbers such as ``0.9`` stay whole."""


class _NameWrapper(textwrap.TextWrapper):
    """textwrap, breaking at :data:`_BREAKS` (with ``break_on_hyphens=False``)."""

    wordsep_simple_re = _BREAKS


def format_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], width: int = TABLE_WIDTH
) -> str:
    """A text table within ``width`` columns (when it can be: 6 per column at least), by rich.

    The widest columns are narrowed first, no further than their longest piece, then to the
    minimum; a cell longer than its column wraps onto more lines (:class:`_NameWrapper`), and
    rows that wrap are set apart by a blank line.

    >>> print(format_table(["run", "reward/total/mean (final)"], [["ab12", "0.5"]], width=20))
          reward/total/
    run   mean (final)
    --------------------
    ab12  0.5
    """
    from rich.console import Console
    from rich.table import Table

    columns = [[str(h), *(str(r[i]) for r in rows)] for i, h in enumerate(header)]
    widths = [max(len(c) for c in cells) for cells in columns]
    budget = width - 2 * (len(widths) - 1)
    floors = [
        max(_MIN_COLUMN, *(len(p.strip()) for c in cells for p in _BREAKS.split(c)))
        for cells in columns
    ]
    for floor in (floors, [_MIN_COLUMN] * len(widths)):
        while sum(widths) > budget:
            narrowable = [i for i, w in enumerate(widths) if w > floor[i]]
            if not narrowable:
                break
            widths[max(narrowable, key=lambda i: widths[i])] -= 1
    wrapped = [
        ["\n".join(_NameWrapper(w, break_on_hyphens=False).wrap(c)) for c in cells]
        for cells, w in zip(columns, widths, strict=True)
    ]
    spaced = any("\n" in c for cells in wrapped for c in cells[1:])
    table = Table(
        box=_RULED, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), leading=int(spaced)
    )
    for cells, w in zip(wrapped, widths, strict=True):
        table.add_column(cells[0], width=w, overflow="fold", vertical="top")
    for row in zip(*(cells[1:] for cells in wrapped), strict=True):
        table.add_row(*row)
    console = Console(width=width, color_system=None, markup=False, emoji=False, highlight=False)
    with console.capture() as captured:
        console.print(table)
    return "\n".join(line.rstrip() for line in captured.get().splitlines())
