"""Rollouts of the same prompt in two runs, side by side.

Two runs of a paired sweep (one seed, two algorithms) validate on the same prompts, greedily:
each validation rollout is keyed by its prompt id (``val-<row>``) and rank, so the runs' final
validations pair one to one. Training rollouts pair the same way where both runs logged the same
group at the same rank (a paired sweep shares each step's prompts).

A pair is kept only when both rollouts show the same prompt: two runs on different data share
ids, not questions, and their rollouts are reported as unmatched instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from slca_exp.rollouts.record import RolloutRecord

REWARDS = ("tool", "summary", "total")
"""The rewards a pair compares (``B - A``)."""


def question(record: RolloutRecord) -> str:
    """The rollout's last user message (what the two runs must have been asked alike)."""
    asked = [m for m in record.prompt if m.get("role") == "user"]
    return str(asked[-1].get("content", "")) if asked else ""


@dataclass(frozen=True)
class Pair:
    """One prompt's rollout in run A and in run B."""

    a: RolloutRecord
    b: RolloutRecord

    @property
    def key(self) -> str:
        """The prompt id, with the rank where the rollouts are ranked (``train-3 best``)."""
        return f"{self.a.group} {self.a.rank}".strip()

    def delta(self, reward: str) -> float | None:
        """``B - A`` for one of :data:`REWARDS`; ``None`` when either side does not know it."""
        a, b = getattr(self.a.rewards, reward), getattr(self.b.rewards, reward)
        if a is None or b is None or math.isnan(a) or math.isnan(b):
            return None
        return b - a


@dataclass(frozen=True)
class Pairing:
    """The pairs of two runs' rollouts, most changed first, and what did not pair."""

    pairs: list[Pair]
    only_a: list[str]
    only_b: list[str]
    different_prompt: list[str]

    def mean_delta(self, reward: str) -> float | None:
        """The mean ``B - A`` over the pairs that know ``reward`` (None when none does)."""
        known = [d for p in self.pairs if (d := p.delta(reward)) is not None]
        return sum(known) / len(known) if known else None

    def counts(self, reward: str = "total") -> tuple[int, int, int]:
        """How many pairs B is ahead on, behind on, level on (unknown ones left out)."""
        known = [d for p in self.pairs if (d := p.delta(reward)) is not None]
        return sum(d > 0 for d in known), sum(d < 0 for d in known), sum(d == 0 for d in known)


def pair_rollouts(a: Sequence[RolloutRecord], b: Sequence[RolloutRecord]) -> Pairing:
    """Pair ``a`` and ``b`` by prompt id and rank, the most changed first.

    Ordered by ``|B - A|`` of the total, then by prompt id; pairs with an unknown total last.
    """
    by_key = {(r.group, r.rank): r for r in b}
    pairs, only_a, different = [], [], []
    for record in a:
        other = by_key.pop((record.group, record.rank), None)
        label = f"{record.group} {record.rank}".strip()
        if other is None:
            only_a.append(label)
        elif question(other) != question(record):
            different.append(label)
        else:
            pairs.append(Pair(record, other))
    only_b = [f"{g} {r}".strip() for g, r in by_key]

    def change(pair: Pair) -> tuple[float, str]:
        d = pair.delta("total")
        return (-abs(d) if d is not None else 1.0, pair.key)

    return Pairing(sorted(pairs, key=change), only_a, only_b, different)
