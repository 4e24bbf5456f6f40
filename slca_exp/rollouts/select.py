"""Which rollouts of a step are logged: ``tracking.rollouts``.

A logged step shows whole groups, each by its best and its worst rollout (by routed total), so
the contrast the group's advantages are computed from is on the page: ``per_step`` rollouts
come from the first ``ceil(per_step / 2)`` groups of the batch (prompts are drawn at random
each step, so these are a random sample of the step's groups). Validation rollouts (one per
prompt) are logged in order, the first ``val`` of them.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence


def due(step: int, every: int) -> bool:
    """Whether RL step ``step`` is logged: the first step and every ``every``-th (0: none)."""
    return every > 0 and step > 0 and (step == 1 or step % every == 0)


def pick(
    groups: Sequence[Hashable], totals: Sequence[float], per_step: int
) -> list[tuple[int, str]]:
    """``(rollout index, "best" | "worst")`` of the rollouts to log, group by group.

    Args:
        groups: (B,) each rollout's group (prompt) id, in batch order.
        totals: (B,) each rollout's routed total; NaN (not scored) ranks below every number.
        per_step: how many to log (at most B).

    Among equal totals the best is the earliest rollout and the worst the latest, so a group
    whose rollouts all scored the same still shows two of them. A group of one gives its only
    rollout (``best``); an odd ``per_step`` takes only the best of its last group.

    Example:
        >>> pick(["a", "a", "b", "b"], [0.1, 0.9, 0.5, float("nan")], 4)
        [(1, 'best'), (0, 'worst'), (2, 'best'), (3, 'worst')]

    """
    if len(groups) != len(totals):
        raise ValueError(f"{len(groups)} group ids for {len(totals)} totals")
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    chosen: list[tuple[int, str]] = []
    for rows in members.values():
        left = per_step - len(chosen)
        if left <= 0:
            break
        key = [_rank_value(totals[i]) for i in rows]
        best = rows[max(range(len(rows)), key=lambda j: (key[j], -j))]
        worst = rows[min(range(len(rows)), key=lambda j: (key[j], -j))]
        chosen.append((best, "best"))
        if left >= 2 and worst != best:
            chosen.append((worst, "worst"))
    return chosen


def _rank_value(total: float) -> float:
    value = float(total)
    return value if math.isfinite(value) else -math.inf
