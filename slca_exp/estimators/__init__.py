"""Advantage estimators: GRPO, SLCA-GRPO and ToolPO-GRPO, vectorised, behind one registry.

Shape notation: B rollouts, T response tokens, G groups (rollouts of one prompt).
"""

from slca_exp.estimators.base import (
    ESTIMATORS,
    Estimator,
    EstimatorParams,
    RolloutScores,
    get_estimator,
    register_estimator,
)
from slca_exp.estimators.grpo import grpo_advantages
from slca_exp.estimators.segments import segment_masks
from slca_exp.estimators.slca import slca_grpo_advantages
from slca_exp.estimators.toolpo import toolpo_grpo_advantages
from slca_exp.estimators.types import SegmentAdvantages

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "EstimatorParams",
    "RolloutScores",
    "SegmentAdvantages",
    "get_estimator",
    "grpo_advantages",
    "register_estimator",
    "segment_masks",
    "slca_grpo_advantages",
    "toolpo_grpo_advantages",
]
