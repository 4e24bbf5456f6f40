"""The reward side's ``reward_extra_info`` rows read for the trainer, in the batch's row order.

Which rollouts have no summary segment or an absent summary or tool score, the (tool, summary,
total) scores the reward side reported, and our step and ``val/*`` metrics rebuilt from them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from slca_exp.core import names
from slca_exp.engines.verl.rewards import (
    NO_SUMMARY_KEY,
    SUMMARY_FAILED_KEY,
    SUMMARY_KEY,
    TOOL_FAILED_KEY,
    TOOL_KEY,
    TOTAL_KEY,
    hierr_score,
    reward_metrics,
    success_totals,
)
from slca_exp.estimators import RolloutScores
from slca_exp.rewards.routing import success_stats


def no_summary_rows(infos: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """(B,) bool: the rollouts the reward side marked as having no summary segment."""
    return np.array([bool(info.get(NO_SUMMARY_KEY, 0)) for info in infos], dtype=bool)


def absent_summary_rows(infos: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """(B,) bool: rollouts whose summary the judge could not score (``judge_failure=absent``).

    ``rm_scores`` holds 0 for them; the estimator leaves them out of the normalisation instead.
    """
    failed = [bool(i.get(SUMMARY_FAILED_KEY, 0)) and not i.get(NO_SUMMARY_KEY, 0) for i in infos]
    return np.array(failed, dtype=bool)


def absent_tool_rows(infos: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """(B,) bool: rollouts whose R_tool the outcome judge could not decide (absent).

    ``rm_scores`` holds 0 for them; the estimator leaves their tool segment out instead.
    """
    return np.array([bool(i.get(TOOL_FAILED_KEY, 0)) for i in infos], dtype=bool)


def reported_scores(infos: Sequence[Mapping[str, Any]]) -> RolloutScores | None:
    """The reward side's (tool, summary, total) of each rollout, (B,) float32 each.

    ``None`` unless every row reports them (another reward manager reports none). The total is
    the one the reward configures: ``reward.process_weight * R_tool + summary_weight * R_sum``,
    or the penalty.
    """
    if not infos or not all(TOTAL_KEY in i and TOOL_KEY in i and SUMMARY_KEY in i for i in infos):
        return None
    columns = {
        key: torch.tensor([float(i[key]) for i in infos], dtype=torch.float32)
        for key in (TOOL_KEY, SUMMARY_KEY, TOTAL_KEY)
    }
    return RolloutScores(
        tool=columns[TOOL_KEY],
        summary=columns[SUMMARY_KEY],
        total=columns[TOTAL_KEY],
    )


def validation_metrics(
    infos: Sequence[Mapping[str, Any]], *, process_weight: float = 1.0, summary_weight: float = 1.0
) -> dict[str, float]:
    """Our ``val/*`` metrics of a validation pass, from its rollouts' ``reward_extra_info``.

    The local engine's validation metrics: ``val/reward/*``, ``val/judge/*``,
    ``val/outcome/*`` and the paper's ``val/success@k`` and ``val/tool_success@k``
    (``slca_exp.rewards.routing.success_stats``); ``{}`` when no row carries our keys. Each
    success metric is the mean of its per-rollout flag (``rewards.success_flags``), which verl's
    validation aggregates as ``val-aux/<source>/slca/success@k/mean@1``.
    """
    rows = [info for info in infos if info and TOOL_KEY in info]
    if not rows:
        return {}
    totals = success_totals(rows)
    hierr = [hierr_score(i) for i in rows]
    metrics = {names.val(k): v for k, v in reward_metrics(rows).items()}
    weights = {"process_weight": process_weight, "summary_weight": summary_weight}
    return metrics | success_stats(totals, hierr, **weights)


def segment_metrics(
    infos: Sequence[Mapping[str, Any]], estimator_stats: Mapping[str, float]
) -> dict[str, float]:
    """The step's metrics under our names: ``reward/*``, ``judge/*`` and the estimator's."""
    return {**reward_metrics(infos), **{k: float(v) for k, v in estimator_stats.items()}}
