"""Turn per-rollout segment advantages into token advantages."""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from slca_exp.estimators.group import finite, segment_stats
from slca_exp.estimators.host import host
from slca_exp.estimators.segments import SegmentSplit
from slca_exp.estimators.types import SegmentAdvantages


def route(
    split: SegmentSplit,
    adv: np.ndarray,
    present: np.ndarray,
    index: np.ndarray,
    num_groups: int,
) -> SegmentAdvantages:
    """Give tool tokens ``adv[0]`` and summary tokens ``adv[1]``; every other token 0.

    Args:
        split: the batch's segments.
        adv: (2, B) float64 advantage of each rollout's tool (row 0) and summary (row 1) segment.
        present: (2, B) bool, rollouts whose segment took part in normalisation (for the stats).
        index: (B,) int64 dense group ids.
        num_groups: G.

    Returns:
        The :class:`SegmentAdvantages` with its stats.

    """
    has = np.stack([host(split.has_tool), host(split.has_summary)])
    # Zero the advantage of a missing segment, so that the per-rollout vectors mean "what this
    # rollout's segment tokens receive"; saturate instead of overflowing float32.
    adv32 = np.clip(finite(np.where(has, adv, 0.0)), -_F32_MAX, _F32_MAX).astype(np.float32)
    advantages = fill_advantages(split, adv32[0], adv32[1])
    # The metrics are computed when read, from a copy (the caller owns the per-rollout vectors).
    stats = partial(_stats, adv32.copy(), present, has, split, index, num_groups)
    per_rollout = torch.from_numpy(adv32).to(split.mask.device)
    return SegmentAdvantages(
        advantages=advantages,
        tool_adv=per_rollout[0],
        summary_adv=per_rollout[1],
        split=split,
        stats=stats,
    )


def _stats(
    adv: np.ndarray,
    present: np.ndarray,
    has: np.ndarray,
    split: SegmentSplit,
    index: np.ndarray,
    num_groups: int,
) -> dict[str, float]:
    """:func:`segment_stats` of a routed call (the split counts its tool tokens only now)."""
    tokens = (split.tool_tokens, split.summary_tokens)
    return segment_stats(adv, present, has, tokens, index, num_groups)


def fill_advantages(
    split: SegmentSplit, tool_adv: np.ndarray | torch.Tensor, summary_adv: np.ndarray | torch.Tensor
) -> torch.Tensor:
    """(B, T) float32 token advantages: ``tool_adv`` on tool tokens, ``summary_adv`` on summary.

    The response mask is widened to 0/1 floats and multiplied, tile by tile (:data:`TILE`
    columns), by one value per row and tile: the summary value on the tiles that lie wholly
    inside the row's summary run, the row's tool value elsewhere (its summary value when it has
    no tool segment). Both passes are vectorised. The summary tokens left over, in the two tiles
    where the run begins and ends (fewer than 2 * :data:`TILE` per row), are then overwritten
    with one scatter. Tokens outside the mask get 0 (-0.0 where the row's tool value is
    negative, which compares equal to 0); rows whose two values are equal (always, for GRPO)
    are one multiply.
    """
    tool = host(tool_adv).astype(np.float32, copy=False)
    summary = host(summary_adv).astype(np.float32, copy=False)
    mask = split.mask
    batch, length = mask.shape
    start = host(split.summary_start)
    end = start + host(split.summary_len)
    fill = np.where(host(split.has_tool), tool, summary)
    differ = fill != summary
    # The summary run's whole tiles: [inner_start, inner_end), empty when it spans none.
    inner_start = -(-start // TILE) * TILE
    inner_end = np.where(end == length, end, end // TILE * TILE)
    whole = differ & (inner_start < inner_end)
    inner_end = np.where(whole, inner_end, inner_start)
    tiles, rest = divmod(length, TILE)
    corners = np.arange(tiles + (rest > 0)) * TILE  # every tile's first column
    inside = (corners >= inner_start.reshape(-1, 1)) & (corners < inner_end.reshape(-1, 1))
    value = torch.from_numpy(np.where(inside, summary.reshape(-1, 1), fill.reshape(-1, 1)))
    value = value.to(mask.device)
    # mask (0/1) * value: a vectorised uint8 -> float32 copy and an in-place broadcast multiply
    # are about twice as fast as torch.where, whose CPU kernel is scalar.
    advantages = torch.empty(mask.shape, dtype=torch.float32, device=mask.device)
    advantages.copy_(mask.view(torch.uint8))
    if tiles:
        body = advantages[:, : tiles * TILE].view(batch, tiles, TILE)
        body.mul_(value[:, :tiles].unsqueeze(2))
    if rest:
        advantages[:, tiles * TILE :].mul_(value[:, tiles:])
    # The summary tokens outside those tiles: before and after them, or the whole run when it
    # spans no whole tile.
    head = np.where(whole, inner_start, np.where(differ, end, start)) - start
    tail = np.where(whole, end - inner_end, 0)
    rows = length * np.arange(batch)
    first = np.concatenate([start + rows, inner_end + rows])
    lengths = np.concatenate([head, tail])
    total = int(lengths.sum())
    if total:
        flat = torch.from_numpy(run_positions(first, lengths, total)).to(mask.device)
        values = torch.from_numpy(np.repeat(np.tile(summary, 2), lengths)).to(mask.device)
        advantages.view(-1).scatter_(0, flat, values)
    return advantages


def run_positions(first: np.ndarray, lengths: np.ndarray, total: int) -> np.ndarray:
    """(N,) positions ``first[r], first[r] + 1, ..., first[r] + lengths[r] - 1`` for every run r.

    A cumulative sum of unit steps, with a jump where each run begins: two passes over N, against
    the four of ``repeat(first, lengths) + arange(N)``.
    """
    keep = lengths > 0
    first, lengths = first[keep], lengths[keep]
    begins = np.cumsum(lengths) - lengths  # where each run's positions begin in the output
    steps = np.ones(total, dtype=np.int64)
    jumps = first.astype(np.int64)
    jumps[1:] -= first[:-1] + lengths[:-1] - 1  # from the previous run's last position
    steps[begins] = jumps
    return np.cumsum(steps, out=steps)


_F32_MAX = float(np.finfo(np.float32).max)
TILE = 128
"""Columns per tile of :func:`fill_advantages` (one value per row and tile)."""
