"""The estimator registry: every estimator shares one signature, so callers never branch on names.

An estimator is ``fn(response_mask, group_ids, scores, params) -> SegmentAdvantages`` where
``scores`` carries the three per-rollout scores (tool, summary, total) produced by penalty routing
and ``params`` the algorithm's hyper-parameters. Each estimator reads the scores it needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch

from slca_exp.estimators.group import GroupIds
from slca_exp.estimators.grpo import grpo_advantages
from slca_exp.estimators.slca import slca_grpo_advantages
from slca_exp.estimators.toolpo import toolpo_grpo_advantages
from slca_exp.estimators.types import SegmentAdvantages
from slca_exp.registry import Registry


@dataclass(frozen=True)
class RolloutScores:
    """Per-rollout scores, each (B,) float; NaN marks a score that could not be computed.

    Attributes:
        tool: R_tool after penalty routing (0 when the penalty applies).
        summary: R_sum after penalty routing (the penalty when it applies).
        total: the single GRPO score (w_process * R_tool + w_summary * R_sum, or the penalty).

    """

    tool: torch.Tensor | Sequence[float]
    summary: torch.Tensor | Sequence[float]
    total: torch.Tensor | Sequence[float]


@dataclass(frozen=True)
class EstimatorParams:
    """Hyper-parameters every estimator receives (each reads the ones it uses).

    Attributes:
        tool_weight: lambda_tool, SLCA-GRPO's post-normalisation weight of the tool advantage.
        summary_weight: lambda_sum, same for the summary advantage.
        norm_by_std: divide by the group's unbiased std + eps (False: Dr.GRPO).
        eps: added to the std.
        toolpo_lambda: ToolPO-GRPO's weight of the tool-only advantage.

    """

    tool_weight: float = 1.0
    summary_weight: float = 1.0
    norm_by_std: bool = True
    eps: float = 1e-6
    toolpo_lambda: float = 1.0

    @classmethod
    def from_config(cls, algorithm: Mapping[str, Any] | Any) -> EstimatorParams:
        """Build from an ``algorithm`` config (a mapping or an object with these attributes)."""
        get = (
            algorithm.get
            if isinstance(algorithm, Mapping)
            else (lambda key, default: getattr(algorithm, key, default))
        )
        return cls(**{f.name: get(f.name, f.default) for f in fields(cls)})


class Estimator(Protocol):
    """The signature every registered estimator has."""

    def __call__(
        self,
        response_mask: torch.Tensor,
        group_ids: GroupIds,
        scores: RolloutScores,
        params: EstimatorParams,
    ) -> SegmentAdvantages:
        """Return the advantages of a batch: (B, T) mask, (B,) ids and scores."""
        ...


ESTIMATORS: Registry[Estimator] = Registry("estimator")


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Decorator registering an estimator under ``name`` (duplicates are an error)."""
    return ESTIMATORS.register(name)


def get_estimator(name: str) -> Estimator:
    """Return the estimator registered as ``name``; unknown names list the known ones."""
    return ESTIMATORS.get(name)


@register_estimator("grpo")
def _grpo(
    response_mask: torch.Tensor, group_ids: GroupIds, scores: RolloutScores, params: EstimatorParams
) -> SegmentAdvantages:
    return grpo_advantages(
        response_mask, group_ids, scores.total, norm_by_std=params.norm_by_std, eps=params.eps
    )


@register_estimator("slca_grpo")
def _slca_grpo(
    response_mask: torch.Tensor, group_ids: GroupIds, scores: RolloutScores, params: EstimatorParams
) -> SegmentAdvantages:
    return slca_grpo_advantages(
        response_mask,
        group_ids,
        scores.tool,
        scores.summary,
        tool_weight=params.tool_weight,
        summary_weight=params.summary_weight,
        norm_by_std=params.norm_by_std,
        eps=params.eps,
    )


@register_estimator("toolpo_grpo")
def _toolpo_grpo(
    response_mask: torch.Tensor, group_ids: GroupIds, scores: RolloutScores, params: EstimatorParams
) -> SegmentAdvantages:
    return toolpo_grpo_advantages(
        response_mask,
        group_ids,
        scores.total,
        scores.tool,
        toolpo_lambda=params.toolpo_lambda,
        norm_by_std=params.norm_by_std,
        eps=params.eps,
    )
