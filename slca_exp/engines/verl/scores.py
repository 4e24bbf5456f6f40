"""Per-rollout segment scores read off verl's token-level rewards, each from its own tokens only.

The reward side (``rewards.py``) writes R_tool on the last token of the tool segment and R_sum
on the last token of the summary; with ``use_kl_in_reward`` verl then subtracts a KL term from
every learnable token. The adapter needs back, per rollout, the sum over each segment:

    tool score    = sum of the rewards on the tool tokens (every learnable token before the
                    summary run), read over the response from its first token
    summary score = sum over the summary run, moved to column 0 of a (B, W) block

Neither is computed from the other or from a total, so a segment's score depends on its own
tokens' rewards alone: the same rewards give the same float (the summary's wherever it starts),
and the single value the reward side writes comes back exactly, in float32 or bfloat16. A
reward outside a segment never enters a sum (a non-finite reward there changes nothing).

Cost: a (B, T) batch is never copied or cast as a whole. Without KL in the reward, the rewards
are zero but for the values the reward side wrote: one byte-wise scan finds them, and a segment
holding at most two non-zero rewards is their sum (:func:`sparse_sums`). Otherwise (KL on every
token) the tool sums read each row up to its summary's start, in cache-sized blocks of rows
sorted by that start, and the summary sums read one window per row. Both ways give every
segment the same float.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from slca_exp.estimators import RolloutScores
from slca_exp.estimators.host import host
from slca_exp.estimators.segments import SegmentSplit, split_segments

BLOCK = 1 << 19
"""Tokens per block when summing the tool segments on CPU (a 2 MiB float32 temporary)."""
ALIGN = 64
"""Widths of the blocks summed on CPU are multiples of this (see :func:`tool_sums`)."""
CHUNK = 64
"""Tokens per chunk of the scan for non-zero rewards (see :func:`sparse_sums`)."""
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}
"""The integer dtype of a reward dtype's size: a token is zero when its bits are."""


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
    tool, summary = segment_sums(rewards, split)
    return RolloutScores(tool=tool, summary=summary, total=tool + summary)


def segment_sums(rewards: torch.Tensor, split: SegmentSplit) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) float32 tool and summary sums of (B, T) rewards.

    Rewards as the reward side writes them without KL (one value at the end of each segment)
    are sparse: their non-zero tokens are found with one byte-wise scan (:func:`sparse_sums`),
    and a segment holding at most two of them is their sum, the very float the blocked sums
    give. Other segments, and dense rewards (KL on every token), are summed in blocks.
    """
    found = sparse_sums(rewards, split)
    if found is None:
        return tool_sums(rewards, split), run_sums(rewards, split.summary_start, split.summary_len)
    tool, summary, tool_rest, summary_rest = found
    if tool_rest.any():
        tool_rows = torch.from_numpy(tool_rest).to(rewards.device)
        tool = torch.where(tool_rows, tool_sums(rewards, split, rows=tool_rest), tool)
    if summary_rest.any():
        runs = host(split.summary_len)
        width = int(runs.max())  # the width the blocked sums of every run would have
        length = torch.from_numpy(np.where(summary_rest, runs, 0))
        rest = run_sums(rewards, split.summary_start, length, width)
        summary = torch.where(torch.from_numpy(summary_rest).to(rewards.device), rest, summary)
    return tool, summary


def sparse_sums(
    rewards: torch.Tensor, split: SegmentSplit
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray] | None:
    """Tool and summary sums read off the non-zero rewards alone; ``None`` if they are dense.

    One reduction finds the chunks of :data:`CHUNK` tokens with a non-zero byte (a byte-wise
    max: a token is non-zero, or -0.0, when one of its bytes is); only those chunks are read
    again, to place each non-zero token in its row's tool segment, its summary or neither. A
    segment with at most two of them sums to exactly what the blocked sums give (one rounding
    of their sum, the zeros adding nothing); segments with more are flagged for the blocked
    sums. The rewards count as dense (``None``) when the first token of a summary run longer
    than one token is not zero (the reward side writes only on a run's last token; verl's KL
    penalty lands on every token), or when more than a quarter of the chunks are non-zero.

    Returns:
        ``(tool, summary, tool_rest, summary_rest)``: (B,) float32 sums, and (B,) bool numpy
        flags of the rows whose tool (summary) segment still needs the blocked sums.

    """
    if rewards.device.type != "cpu":
        return None
    batch, length = rewards.shape
    flat = rewards.reshape(-1)
    start, runs = host(split.summary_start), host(split.summary_len)
    probe = np.flatnonzero(runs >= 2)
    if len(probe) and bool(flat.index_select(0, _index(probe * length + start[probe])).any()):
        return None
    bits = _BITS.get(rewards.element_size())
    if bits is None:
        return None
    chunks = flat.numel() // CHUNK
    body = flat[: chunks * CHUNK].view(chunks, CHUNK)
    hot = torch.nonzero(body.view(torch.uint8).amax(dim=1)).view(-1)
    if len(hot) * 4 > chunks:
        return None
    # Every token of a non-zero chunk, then the few after the last whole chunk.
    picked = torch.cat([body.index_select(0, hot).view(-1), flat[chunks * CHUNK :]])
    nonzero = torch.nonzero(picked.view(bits)).view(-1)
    value = host(picked.index_select(0, nonzero).float())
    nonzero, hot = host(nonzero), host(hot)
    head = len(hot) * CHUNK  # the picked tokens of whole chunks; after them, the rest
    places = nonzero - head + chunks * CHUNK
    inside = nonzero < head
    chunk, offset = np.divmod(nonzero[inside], CHUNK)
    places[inside] = hot[chunk] * CHUNK + offset
    row, col = np.divmod(places, length)
    end = start + runs
    in_tool = host(split.mask)[row, col] & (col < start[row])
    in_summary = (col >= start[row]) & (col < end[row])
    out = []
    for hit in (in_tool, in_summary):
        sums = np.zeros(batch, dtype=np.float32)
        with np.errstate(all="ignore"):  # IEEE arithmetic: inf and NaN are the sums' values
            np.add.at(sums, row[hit], value[hit])  # in token order, in float32
        rest = np.bincount(row[hit], minlength=batch) > 2
        out += [torch.from_numpy(sums), rest]
    return out[0], out[2], out[1], out[3]


def _index(values: np.ndarray) -> torch.Tensor:
    """An int64 index tensor (CPU) of a numpy array."""
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))


def tool_sums(
    rewards: torch.Tensor, split: SegmentSplit, rows: np.ndarray | None = None
) -> torch.Tensor:
    """(B,) float32 sums of the rewards on each rollout's tool tokens (on ``rows``, (B,) bool).

    A row is read only up to its summary's start. On CPU the rows are taken in order of that
    start, a block of them at a time (:data:`BLOCK` tokens, so the temporaries stay in cache),
    each block up to the latest start in it rounded up to :data:`ALIGN` columns and zero-padded:
    torch's CPU sum of a zero-padded row whose width is a multiple of :data:`ALIGN` does not
    depend on the width, so two rows with the same tool tokens (same places, same rewards) get
    the same float whichever blocks they fall in. Elsewhere all rows are one block of one width.
    """
    batch = rewards.shape[0]
    device = rewards.device
    sums = torch.zeros(batch, dtype=torch.float32, device=device)
    start = host(split.summary_start)
    order = np.argsort(start, kind="stable")
    if rows is not None:
        order = order[rows[order]]
    ascending = start[order]
    first = int(np.searchsorted(ascending, 0, side="right"))  # rows with no token before it
    if first == len(order):
        return sums
    order, ascending = order[first:], ascending[first:]
    step = len(order)
    if device.type == "cpu":
        step = max(1, BLOCK // _aligned(int(ascending[-1])))
    blocks = [(i, min(i + step, len(order))) for i in range(0, len(order), step)]
    widths = [_aligned(int(ascending[j - 1])) for _, j in blocks]
    rows = torch.from_numpy(order).to(device)
    # A row's keep pattern: the (widest + 1, widest) prefix windows, row widest - start.
    prefix = _prefix_windows(widths[-1], device)
    cut = torch.from_numpy(widths[-1] - ascending).to(device)
    sorted_sums = torch.empty(len(order), dtype=torch.float32, device=device)
    kept = torch.empty(step * widths[-1], dtype=torch.float32, device=device)
    for exact in (False, True):
        for (i, j), width in zip(blocks, widths, strict=True):
            _block_sums(rewards, split.mask, rows[i:j], prefix, cut[i:j], width, kept, exact)
            torch.sum(kept[: (j - i) * width].view(j - i, width), -1, out=sorted_sums[i:j])
        if bool(torch.isfinite(sorted_sums).all()):  # else 0 * inf is NaN: sum again, exactly
            break
    sums[rows] = sorted_sums
    return sums


def _block_sums(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    rows: torch.Tensor,
    prefix: torch.Tensor,
    cut: torch.Tensor,
    width: int,
    kept: torch.Tensor,
    exact: bool,
) -> None:
    """Write one block of kept rewards, (rows, width) zero-padded, into the buffer ``kept``.

    The mask is widened to float32 and multiplied in: two vectorised passes, where
    ``torch.where`` is a scalar loop on CPU. ``exact`` uses ``torch.where``, which never reads
    the rewards it leaves out (the same reduction, so finite rows keep their floats).
    """
    cols = min(width, rewards.shape[1])
    keep = mask[:, :cols].index_select(0, rows)
    keep &= prefix[:, :cols].index_select(0, cut)
    values = rewards[:, :cols].index_select(0, rows)
    block = kept[: len(rows) * width].view(len(rows), width)
    if cols < width:
        block[:, cols:].zero_()
        block = block[:, :cols]
    if exact:
        block.copy_(torch.where(keep, values, 0.0))
    else:
        block.copy_(keep.view(torch.uint8)).mul_(values)


def run_sums(
    rewards: torch.Tensor, start: torch.Tensor, length: torch.Tensor, width: int | None = None
) -> torch.Tensor:
    """(B,) float32 sums of ``rewards[b, start[b] : start[b] + length[b]]``.

    Each run is summed as a row of a (B, W) block in which it starts at column 0 (W the longest
    run, or ``width``), so the same run of values gives the same sum wherever it starts. The
    block copies one window per row of the flat rewards (``unfold`` views them all without
    copying); a window that would run past the end of the batch (only the last row's can) is
    rebuilt.
    """
    batch, columns = rewards.shape
    device = rewards.device
    start, length = host(start), host(length)
    longest = int(length.max()) if batch else 0
    if longest == 0:
        return torch.zeros(batch, dtype=torch.float32, device=device)
    longest = max(longest, width or 0)
    flat = rewards.reshape(-1)
    first = start + columns * np.arange(batch)
    limit = flat.numel() - longest
    windows = flat.unfold(0, longest, 1).index_select(
        0, torch.from_numpy(np.minimum(first, limit)).to(device)
    )
    if first[-1] > limit:
        begin, n = int(start[-1]), int(length[-1])
        windows[-1].zero_()
        windows[-1, :n] = rewards[-1, begin : begin + n]
    cut = torch.from_numpy(longest - length).to(device)
    keep = _prefix_windows(longest, device).index_select(0, cut)
    kept = torch.empty(windows.shape, dtype=torch.float32, device=device)
    sums = kept.copy_(keep.view(torch.uint8)).mul_(windows).sum(-1)
    if not bool(torch.isfinite(sums).all()):  # 0 * inf is NaN: sum again, reading less
        sums = torch.where(keep, windows, 0.0).sum(-1, dtype=torch.float32)
    return sums


@lru_cache(maxsize=8)
def _prefix_windows(width: int, device: torch.device) -> torch.Tensor:
    """(width + 1, width) bool view whose row ``width - n`` is True on its first ``n`` columns."""
    pattern = torch.zeros(2 * width, dtype=torch.bool, device=device)
    pattern[:width] = True
    return pattern.unfold(0, width, 1)


def _aligned(width: int) -> int:
    """``width`` rounded up to a multiple of :data:`ALIGN`."""
    return -(-width // ALIGN) * ALIGN
