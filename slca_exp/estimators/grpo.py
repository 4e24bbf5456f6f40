"""GRPO ("w/o SLCA" baseline): one group-normalised scalar per rollout on every response token.

Matches verl's ``compute_grpo_outcome_advantage`` (singleton groups keep their raw score: mean 0,
std 1), computed without a loop over samples or groups. A NaN score means the rollout could not be
scored: it is left out of its group's statistics and gets advantage 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from slca_exp.estimators.group import (
    GroupIds,
    as_scores,
    check_hparams,
    dense_group_codes,
    group_normalize,
)
from slca_exp.estimators.host import host
from slca_exp.estimators.routing import route
from slca_exp.estimators.segments import split_segments
from slca_exp.estimators.types import SegmentAdvantages


def grpo_advantages(
    response_mask: torch.Tensor,
    group_ids: GroupIds,
    score: torch.Tensor | Sequence[float],
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> SegmentAdvantages:
    """GRPO outcome advantages.

    Args:
        response_mask: (B, T), non-zero on learnable tokens.
        group_ids: (B,) prompt ids (ints, strings, uuids, numpy object arrays).
        score: (B,) total score of each rollout (NaN = could not be scored).
        norm_by_std: divide by the group's unbiased std + eps (False: Dr.GRPO, mean only).
        eps: added to the std.

    Returns:
        :class:`SegmentAdvantages`; ``advantages`` (B, T) is the rollout's advantage on every
        learnable token; ``tool_adv``/``summary_adv`` repeat it for rollouts that have the segment.

    """
    check_hparams(eps=eps)
    split = split_segments(response_mask)
    batch = split.mask.shape[0]
    values = as_scores(score, batch, "score").reshape(1, -1)
    index, groups = dense_group_codes(group_ids, batch)
    present = np.isfinite(values)
    kw = {"norm_by_std": norm_by_std, "eps": eps, "small_group": "passthrough"}
    adv = group_normalize(values, present, index, groups, **kw)
    both = np.stack([host(split.has_tool), host(split.has_summary)]) & present
    return route(split, np.broadcast_to(adv, (2, batch)), both, index, groups)
