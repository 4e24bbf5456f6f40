"""The validation prompts that moved most between the two algorithms of a sweep.

For ``compare --report`` on a sweep that swept ``algorithm`` over two levels: each pair of runs
that differ only in the algorithm (the same seed and the same value of every other swept key)
has its final validation rollouts paired by prompt (:mod:`slca_exp.rollouts.pairing`); the
difference of each reward (second level minus first) is averaged per prompt over the pairs, and
the prompts with the largest mean change of the total come first.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from slca_exp.analysis.differences import levels
from slca_exp.analysis.runs import seed_of, swept_value

FACTOR = "algorithm"
SHOWN = 5
"""Prompts listed, at most."""


@dataclass
class Moved:
    """One prompt over the pairs of runs: each algorithm's rewards and ``B - A``."""

    group: str
    question: str
    a: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    b: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    delta: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def moved_prompts(
    observe: Any,  # noqa: ANN401 - an analysis.runs.Observations
    runs: Sequence[Any],
    swept: Sequence[str],
) -> tuple[list[str], list[Moved]] | None:
    """(the two algorithms, the prompts most changed first); ``None`` when nothing pairs.

    Only the runs' last logged validation rollouts are read (``tracking.rollouts.val``).
    """
    from slca_exp.rollouts.pairing import REWARDS, pair_rollouts, question

    if FACTOR not in swept:
        return None
    algorithms = levels(runs, FACTOR, swept_value)
    if len(algorithms) != 2:
        return None
    others = [k for k in swept if k not in (FACTOR, "seed")]
    cells: dict[tuple[str, ...], dict[str, Any]] = defaultdict(dict)
    for run in runs:
        key = (seed_of(run), *(swept_value(run, k) for k in others))
        cells[key][swept_value(run, FACTOR)] = run
    found: dict[tuple[str, str], Moved] = {}
    for cell in cells.values():
        if set(cell) != set(algorithms):
            continue
        records = [observe.final_val_records(cell[algorithm]) for algorithm in algorithms]
        for pair in pair_rollouts(*records).pairs:
            moved = found.setdefault(
                (pair.a.group, question(pair.a)), Moved(pair.a.group, question(pair.a))
            )
            for reward in REWARDS:
                a, b, d = (
                    getattr(pair.a.rewards, reward),
                    getattr(pair.b.rewards, reward),
                    pair.delta(reward),
                )
                if d is not None:
                    moved.a[reward].append(a)
                    moved.b[reward].append(b)
                    moved.delta[reward].append(d)
    if not found:
        return None

    def change(m: Moved) -> tuple[float, str]:
        d = _mean(m.delta["total"])
        return (-abs(d) if d is not None else 1.0, m.group)

    return list(algorithms), sorted(found.values(), key=change)


def moved_rows(
    algorithms: Sequence[str], moved: Sequence[Moved]
) -> tuple[list[str], list[list[str]]]:
    """The report's table: prompt, pairs, each algorithm's mean tool / summary / total, B - A."""
    a, b = algorithms

    def num(value: float | None, spec: str = ".3f") -> str:
        return "-" if value is None else format(value, spec)

    header = ["prompt", "question", "pairs"]
    for name in (a, b):
        header += [f"{name} tool", f"{name} summary", f"{name} total"]
    header += [f"{b} - {a} total"]
    rows = []
    for m in moved[:SHOWN]:
        row = [m.group, m.question.replace("|", "/"), str(len(m.delta["total"]))]
        for side in (m.a, m.b):
            row += [num(_mean(side[r])) for r in ("tool", "summary", "total")]
        row.append(num(_mean(m.delta["total"]), "+.3f"))
        rows.append(row)
    return header, rows
