"""Result type shared by every advantage estimator.

Shape notation: ``B`` rollouts in the batch, ``T`` response tokens per rollout (padded), ``G``
groups (rollouts of one prompt share a group id, verl's ``uid``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from slca_exp.estimators.segments import SegmentSplit


class SegmentAdvantages:
    """What an estimator returns.

    Attributes:
        advantages: (B, T) float32 token advantages; 0 outside the response mask.
        tool_adv: (B,) float32 advantage each rollout's tool tokens receive (0 when it has none).
        summary_adv: (B,) float32 advantage each rollout's summary tokens receive (0 when none).
        stats: metric name -> value, named as in ``slca_exp.core.names``; always finite.
            Computed on first access: a caller that does not read them (verl's advantage step;
            slca-exp's trainer reads them after it) does not pay for them.
        tool_mask: (B, T) bool, the tool segment (every learnable run but the last); built on
            first access.
        summary_mask: (B, T) bool, the summary segment (the last learnable run); built on first
            access.

    """

    def __init__(
        self,
        advantages: torch.Tensor,
        tool_adv: torch.Tensor,
        summary_adv: torch.Tensor,
        split: SegmentSplit,
        stats: dict[str, float] | Callable[[], dict[str, float]],
    ) -> None:
        self.advantages = advantages
        self.tool_adv = tool_adv
        self.summary_adv = summary_adv
        self._stats = stats
        self._split = split

    @property
    def stats(self) -> dict[str, float]:
        """Metric name -> value (computed on first access)."""
        if callable(self._stats):
            self._stats = self._stats()
        return self._stats

    @property
    def tool_mask(self) -> torch.Tensor:
        """(B, T) bool tool segment."""
        return self._split.tool_mask

    @property
    def summary_mask(self) -> torch.Tensor:
        """(B, T) bool summary segment."""
        return self._split.summary_mask

    @property
    def returns(self) -> torch.Tensor:
        """(B, T) returns; outcome-only estimators use the advantages as returns (as GRPO does)."""
        return self.advantages

    def __repr__(self) -> str:
        return f"SegmentAdvantages(shape={tuple(self.advantages.shape)}, stats={self.stats})"
