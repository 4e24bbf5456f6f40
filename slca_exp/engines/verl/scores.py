"""Per-rollout segment scores read off verl's token-level rewards, each from its own tokens only.

The reward side (``rewards.py``) writes R_tool on the last token of the tool segment and R_sum
on the last token of the summary; with ``use_kl_in_reward`` verl then subtracts a KL term from
every learnable token. The adapter needs back, per rollout, the sum over each segment:

    tool score    = sum of the rewards on the tool tokens (every learnable token before the
                    summary run), read over the response from its first token
    summary score = sum over the summary run, moved to column 0 of a (B, W) block

Neither is computed from the other or from a total, so a segment's score depends on its own
tokens' rewards alone: the same rewards give the same float (the summary's wherever it starts),
and the single value the reward side writes comes back exactly, in float32 or bfloat16. Tokens
outside a segment are never read (a non-finite reward there changes nothing).

Cost: a (B, T) batch is never copied or cast as a whole. The tool sums read each row up to its
summary's start, in cache-sized blocks of rows sorted by that start; the summary sums read one
window per row.
"""

from __future__ import annotations

import bisect

import torch

from slca_exp.estimators import RolloutScores
from slca_exp.estimators.segments import SegmentSplit, split_segments

BLOCK = 1 << 18
"""Tokens per block when summing the tool segments on CPU (a 1 MiB float32 temporary)."""
ALIGN = 64
"""Widths of the blocks summed on CPU are multiples of this (see :func:`tool_sums`)."""


def segment_scores(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor | SegmentSplit
) -> RolloutScores:
    """Per-rollout (tool, summary, total) scores: each segment's rewards summed over its tokens.

    Args:
        token_level_rewards: (B, T) rewards as verl hands them to an estimator (any float dtype).
        response_mask: (B, T), non-zero on the tokens the policy generated, or its split.

    Returns:
        (B,) float32 scores; a rollout without a tool (summary) segment scores 0 on it. The total
        is their sum (slca-exp's trainer hands the adapter the reward side's weighted total
        instead).

    Raises:
        ValueError: the rewards and the mask differ in shape.

    Example:
        >>> rewards = torch.tensor([[0.0, 0.0, 0.1, 0.0, 0.25], [0.2, 0.0, 0.0, 0.0, 0.25]])
        >>> scores = segment_scores(rewards, torch.tensor([[1, 0, 1, 0, 1], [1, 0, 0, 1, 1]]))
        >>> torch.equal(scores.tool, torch.tensor([0.1, 0.2])), scores.summary.tolist()
        (True, [0.25, 0.25])

    """
    split = split_segments(response_mask)
    if token_level_rewards.shape != split.mask.shape:
        raise ValueError(
            f"token_level_rewards has shape {tuple(token_level_rewards.shape)} but the response "
            f"mask {tuple(split.mask.shape)}: verl hands both as (B, T)"
        )
    rewards = token_level_rewards.to(split.mask.device)
    tool = tool_sums(rewards, split)
    summary = run_sums(rewards, split.summary_start, split.summary_len)
    return RolloutScores(tool=tool, summary=summary, total=tool + summary)


def tool_sums(rewards: torch.Tensor, split: SegmentSplit) -> torch.Tensor:
    """(B,) float32 sums of the rewards on each rollout's tool tokens.

    A row is read only up to its summary's start. On CPU the rows are taken in order of that
    start, a block of them at a time (:data:`BLOCK` tokens, so the temporaries stay in cache),
    each block up to the latest start in it rounded up to :data:`ALIGN` columns and zero-padded:
    torch's CPU sum of a zero-padded row whose width is a multiple of :data:`ALIGN` does not
    depend on the width, so two rows with the same tool tokens (same places, same rewards) get
    the same float whichever blocks they fall in. Elsewhere all rows are one block of one width.
    """
    batch = rewards.shape[0]
    order = torch.argsort(split.summary_start)
    ascending = split.summary_start[order].tolist()
    first = bisect.bisect_right(ascending, 0)  # rows with no token before their summary
    sums = torch.zeros(batch, dtype=torch.float32, device=rewards.device)
    if first == batch:
        return sums
    step = batch - first
    if rewards.device.type == "cpu":
        step = max(1, BLOCK // _aligned(ascending[-1]))
    blocks = [
        (order[i : i + step], ascending[min(i + step, batch) - 1])
        for i in range(first, batch, step)
    ]
    _block_sums(rewards, split, blocks, sums, exact=False)
    if not bool(torch.isfinite(sums).all()):  # 0 * inf is NaN: sum again, reading less
        _block_sums(rewards, split, blocks, sums, exact=True)
    return sums


def _block_sums(
    rewards: torch.Tensor,
    split: SegmentSplit,
    blocks: list[tuple[torch.Tensor, int]],
    sums: torch.Tensor,
    *,
    exact: bool,
) -> None:
    """Write the tool sums of each block ``(rows, latest summary start)`` into ``sums``.

    The mask is widened to float32 and multiplied in: two vectorised passes, where
    ``torch.where`` is a scalar loop on CPU. ``exact`` uses ``torch.where``, which never reads
    the rewards it leaves out (the same reduction, so finite rows keep their floats).
    """
    length = rewards.shape[1]
    widest = _aligned(blocks[-1][1])
    prefix = _prefix_windows(widest, rewards.device)
    kept = torch.empty(len(blocks[0][0]) * widest, dtype=torch.float32, device=rewards.device)
    for rows, latest in blocks:
        width = _aligned(latest)
        cols = min(width, length)
        keep = split.mask[:, :cols].index_select(0, rows)
        keep &= prefix[:, :cols].index_select(0, widest - split.summary_start[rows])
        values = rewards[:, :cols].index_select(0, rows)
        block = kept[: len(rows) * width].view(len(rows), width)
        block[:, cols:].zero_()
        if exact:
            block[:, :cols] = torch.where(keep, values, 0.0)
        else:
            block[:, :cols].copy_(keep.view(torch.uint8)).mul_(values)
        sums[rows] = block.sum(-1)


def run_sums(rewards: torch.Tensor, start: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """(B,) float32 sums of ``rewards[b, start[b] : start[b] + length[b]]``.

    Each run is summed as a row of a (B, W) block in which it starts at column 0 (W the longest
    run), so the same run of values gives the same sum wherever it starts. The block copies one
    window per row of the flat rewards (``unfold`` views them all without copying); a window
    that would run past the end of the batch (only the last row's can) is rebuilt.
    """
    batch, width = rewards.shape
    longest = int(length.max()) if batch else 0
    if longest == 0:
        return torch.zeros(batch, dtype=torch.float32, device=rewards.device)
    flat = rewards.reshape(-1)
    first = start + width * torch.arange(batch, device=start.device)
    limit = flat.numel() - longest
    windows = flat.unfold(0, longest, 1).index_select(0, first.clamp(max=limit))
    if int(first[-1]) > limit:
        begin, n = int(start[-1]), int(length[-1])
        windows[-1].zero_()
        windows[-1, :n] = rewards[-1, begin : begin + n]
    keep = _prefix_windows(longest, rewards.device).index_select(0, longest - length)
    kept = torch.empty(windows.shape, dtype=torch.float32, device=rewards.device)
    sums = kept.copy_(keep.view(torch.uint8)).mul_(windows).sum(-1)
    if not bool(torch.isfinite(sums).all()):  # 0 * inf is NaN: sum again, reading less
        sums = torch.where(keep, windows, 0.0).sum(-1, dtype=torch.float32)
    return sums


def _prefix_windows(width: int, device: torch.device) -> torch.Tensor:
    """(width + 1, width) bool view whose row ``width - n`` is True on its first ``n`` columns."""
    pattern = torch.zeros(2 * width, dtype=torch.bool, device=device)
    pattern[:width] = True
    return pattern.unfold(0, width, 1)


def _aligned(width: int) -> int:
    """``width`` rounded up to a multiple of :data:`ALIGN`."""
    return -(-width // ALIGN) * ALIGN
