"""ToolPO-GRPO baseline: a global GRPO advantage plus an extra tool-only advantage on tool tokens.

Tool tokens get ``A_global + lambda * A_tool``, summary tokens get ``A_global``. ``A_global`` is
the GRPO advantage of the total score (verl's rule, singleton groups pass through); ``A_tool`` is a
presence-filtered normalisation (as in SLCA-GRPO) of a tool-correctness score, e.g. R_tool.

The public SLCA-GRPO code's ToolPO estimator (its patched verl) gives the same advantages for
the same two scores (``tests/estimators/test_toolpo_public_on_cpu.py``); it feeds it R_succ and
R_action, we feed it the reward's total and R_tool (``docs/estimators.md``).
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


def toolpo_grpo_advantages(
    response_mask: torch.Tensor,
    group_ids: GroupIds,
    total_score: torch.Tensor | Sequence[float],
    tool_score: torch.Tensor | Sequence[float],
    *,
    toolpo_lambda: float = 1.0,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> SegmentAdvantages:
    """ToolPO-GRPO advantages.

    Args:
        response_mask: (B, T), non-zero on learnable tokens.
        group_ids: (B,) prompt ids.
        total_score: (B,) total score (NaN = rollout could not be scored).
        tool_score: (B,) tool-correctness score (NaN = absent).
        toolpo_lambda: weight of the tool-only advantage on tool tokens.
        norm_by_std: divide by the unbiased std + eps (False: mean only).
        eps: added to the std.

    Returns:
        :class:`SegmentAdvantages` with ``tool_adv = A_global + lambda * A_tool`` and
        ``summary_adv = A_global``.

    """
    check_hparams(eps=eps, toolpo_lambda=toolpo_lambda)
    split = split_segments(response_mask)
    batch = split.mask.shape[0]
    scores = np.stack(
        [as_scores(total_score, batch, "total_score"), as_scores(tool_score, batch, "tool_score")]
    )
    index, groups = dense_group_codes(group_ids, batch)
    finite = np.isfinite(scores)
    has_tool, has_summary = host(split.has_tool), host(split.has_summary)
    total_present, tool_present = finite[0], finite[1] & has_tool
    # A_global follows verl's GRPO (singletons pass through); A_tool SLCA's guard.
    a_global, a_tool = group_normalize(
        scores,
        np.stack([total_present, tool_present]),
        index,
        groups,
        norm_by_std=norm_by_std,
        eps=eps,
        small_group=("passthrough", "zero"),
    )
    present = np.stack([(total_present | tool_present) & has_tool, total_present & has_summary])
    adv = np.stack([a_global + toolpo_lambda * a_tool, a_global])
    return route(split, adv, present, index, groups)
