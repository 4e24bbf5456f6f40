"""A plain per-sample reference of the estimators, written straight from the method's text.

Loops over rollouts and groups in Python, as the public SLCA-GRPO code does; the vectorised
estimators must agree with it exactly (tests) and beat it by a wide margin (benchmarks).
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch


def runs_of_ones(row: list[int]) -> list[tuple[int, int]]:
    """Contiguous runs of non-zero entries as (start, end) pairs, end exclusive."""
    runs, start = [], None
    for t, bit in enumerate(row):
        if bit and start is None:
            start = t
        elif not bit and start is not None:
            runs.append((start, t))
            start = None
    if start is not None:
        runs.append((start, len(row)))
    return runs


def reference_segment_masks(response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tool, summary) masks, one rollout and one token at a time."""
    tool = torch.zeros(response_mask.shape, dtype=torch.bool)
    summary = torch.zeros(response_mask.shape, dtype=torch.bool)
    for i, row in enumerate(response_mask.tolist()):
        runs = runs_of_ones(row)
        if not runs:
            continue  # no run: neither segment
        start, end = runs[-1]  # the last run is the summary, every earlier run is tool
        summary[i, start:end] = True
        for start, end in runs[:-1]:
            tool[i, start:end] = True
    return tool, summary


def _normalize(
    scores: list[float],
    present: list[bool],
    groups: list[object],
    *,
    norm_by_std: bool,
    eps: float,
    singleton_passthrough: bool,
) -> list[float]:
    members: dict[object, list[int]] = defaultdict(list)
    for i, group in enumerate(groups):
        if present[i]:
            members[group].append(i)
    adv = [0.0] * len(scores)
    for rows in members.values():
        values = [scores[i] for i in rows]
        if len(rows) < 2:
            if singleton_passthrough:  # verl: mean 0, std 1
                for i in rows:
                    adv[i] = scores[i] / (1.0 + eps) if norm_by_std else scores[i]
            continue
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for i in rows:
            adv[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return adv


def _tokens(
    mask: torch.Tensor,
    tool: torch.Tensor,
    summary: torch.Tensor,
    tool_adv: list[float],
    summary_adv: list[float],
) -> torch.Tensor:
    out = torch.zeros(mask.shape, dtype=torch.float32)
    for i in range(mask.shape[0]):
        out[i][tool[i]] = tool_adv[i]
        out[i][summary[i]] = summary_adv[i]
    return out


def reference_slca(
    mask,
    ids,
    tool_score,
    summary_score,
    *,
    tool_weight=1.0,
    summary_weight=1.0,
    norm_by_std=True,
    eps=1e-6,
):
    """SLCA-GRPO: (token advantages, tool_adv, summary_adv)."""
    tool, summary = reference_segment_masks(mask)
    ts = [float(x) for x in tool_score]
    ss = [float(x) for x in summary_score]
    tool_present = [bool(tool[i].any()) and math.isfinite(ts[i]) for i in range(len(ts))]
    sum_present = [bool(summary[i].any()) and math.isfinite(ss[i]) for i in range(len(ss))]
    kw = {"norm_by_std": norm_by_std, "eps": eps, "singleton_passthrough": False}
    a_tool = [a * tool_weight for a in _normalize(ts, tool_present, list(ids), **kw)]
    a_sum = [a * summary_weight for a in _normalize(ss, sum_present, list(ids), **kw)]
    return _tokens(mask, tool, summary, a_tool, a_sum), a_tool, a_sum


def reference_grpo(mask, ids, score, *, norm_by_std=True, eps=1e-6):
    """GRPO with verl's singleton rule: (token advantages, per-rollout advantage)."""
    tool, summary = reference_segment_masks(mask)
    s = [float(x) for x in score]
    present = [math.isfinite(x) for x in s]
    a = _normalize(
        s, present, list(ids), norm_by_std=norm_by_std, eps=eps, singleton_passthrough=True
    )
    return _tokens(mask, tool, summary, a, a), a


def reference_toolpo(
    mask, ids, total, tool_score, *, toolpo_lambda=1.0, norm_by_std=True, eps=1e-6
):
    """ToolPO-GRPO: (token advantages, tool-token advantage, summary-token advantage)."""
    tool, summary = reference_segment_masks(mask)
    t = [float(x) for x in total]
    ts = [float(x) for x in tool_score]
    a_global = _normalize(
        t,
        [math.isfinite(x) for x in t],
        list(ids),
        norm_by_std=norm_by_std,
        eps=eps,
        singleton_passthrough=True,
    )
    tool_present = [bool(tool[i].any()) and math.isfinite(ts[i]) for i in range(len(ts))]
    a_tool = _normalize(
        ts, tool_present, list(ids), norm_by_std=norm_by_std, eps=eps, singleton_passthrough=False
    )
    on_tool = [g + toolpo_lambda * a for g, a in zip(a_global, a_tool, strict=True)]
    return _tokens(mask, tool, summary, on_tool, a_global), on_tool, a_global
