"""Tool / summary segmentation of a rollout, read off its response mask.

SLCA-GRPO (arXiv 2609.29050, Sec. 3) needs no learned segmenter: the response mask is 1 on tokens
the policy generated and 0 on tokens the environment injected (tool responses, chat glue) or on
padding. Its contiguous runs of 1s are the assistant turns. The last run is the summary; the union
of all earlier runs is the tool segment. A rollout with a single run has only a summary; one with
no run has neither.

Everything is vectorised over the batch. The only per-row quantities needed are the start of the
last run and the first and last learnable token: the summary is the run between that start and
the last token, the tool segment every learnable token before it (a rollout has one when its
first learnable token comes before the summary). The "first / last set position" reductions run
on the bool masks viewed as 64-bit words (8 tokens per word), so they allocate only (B, T/8)
temporaries, and the per-row arithmetic that follows runs on the host
(``slca_exp.estimators.host``): at B=1024, T=4096 the split is bound by memory traffic.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import cache, cached_property

import numpy as np
import torch

from slca_exp.estimators.host import host

_WORD = 8  # bool tokens per int64 word
# Powers of 256 below 2**63: a word whose bytes are 0/1 is >= 256**j iff a byte >= j is set.
_BYTE_STEPS = np.array([256**j for j in range(1, _WORD)])
# Words summed as plain int64s: each byte is a count of at most this many tokens, so no byte
# carries into the next.
_BYTE_MAX = 255
_EVEN_BYTES = 0x00FF00FF00FF00FF
# x * _LANE_SUM has the sum of x's four 16-bit lanes in its top lane (each lane <= 2 * 255).
_LANE_SUM = 0x0001000100010001


class SegmentSplit:
    """The two segments of every rollout in a batch (internal form used by the estimators).

    The summary of a rollout is one contiguous run, ``[summary_start, summary_start +
    summary_len)``, so the split is described per row; the (B, T) tool and summary masks are
    built on first access only (routing advantages needs the mask and the summary runs alone).

    Attributes:
        mask: (B, T) bool response mask.
        summary_start: (B,) int64 first summary token (0 when the row has no learnable token).
        summary_len: (B,) int64 number of summary tokens.
        has_tool: (B,) bool, rollouts with at least one tool token.
        has_summary: (B,) bool, rollouts with at least one summary token.
        tool_tokens: () int64 number of tool tokens in the batch (only the metrics need it: it
            may be handed over as a function, counted on first access).
        summary_tokens: () int64 number of summary tokens in the batch.

    """

    def __init__(
        self,
        mask: torch.Tensor,
        summary_start: torch.Tensor,
        summary_len: torch.Tensor,
        has_tool: torch.Tensor,
        tool_tokens: torch.Tensor | Callable[[], torch.Tensor],
    ) -> None:
        self.mask = mask
        self.summary_start = summary_start
        self.summary_len = summary_len
        self.has_tool = has_tool
        self.has_summary = summary_len > 0
        self._tool_tokens = tool_tokens
        self.summary_tokens = summary_len.sum()

    @property
    def tool_tokens(self) -> torch.Tensor:
        """() int64 number of tool tokens in the batch."""
        if callable(self._tool_tokens):
            self._tool_tokens = self._tool_tokens()
        return self._tool_tokens

    @cached_property
    def in_summary_span(self) -> torch.Tensor:
        """(B, T) bool: positions at or after the start of the summary run."""
        return suffix_masks(self.summary_start, self.mask.shape[1])

    @cached_property
    def tool_mask(self) -> torch.Tensor:
        """(B, T) bool: learnable tokens before the summary run."""
        return torch.gt(self.mask, self.in_summary_span)

    @cached_property
    def summary_mask(self) -> torch.Tensor:
        """(B, T) bool: the summary run."""
        return self.mask & self.in_summary_span

    def without_summary(self, rows: torch.Tensor) -> SegmentSplit:
        """The same split where the flagged rollouts have no summary: all their tokens are tool.

        The corrected mask rule: a rollout cut off inside a tool call (truncated, or out of
        turns) ends on a tool call, not on a summary, so its last learnable run is tool.

        Args:
            rows: (B,) bool, the rollouts that have no summary segment.

        """
        rows = torch.as_tensor(rows, dtype=torch.bool, device=self.mask.device)
        if rows.shape != self.summary_len.shape:
            raise ValueError(
                f"rows must have shape ({self.summary_len.shape[0]},), one flag per rollout; "
                f"got {tuple(rows.shape)}"
            )
        moved = torch.where(rows, self.summary_len, 0)
        more = moved.sum()
        return SegmentSplit(
            self.mask,
            torch.where(rows, self.mask.shape[1], self.summary_start),
            self.summary_len - moved,
            self.has_tool | (rows & (self.summary_len > 0)),
            lambda: self.tool_tokens + more,
        )


def as_bool_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """Return the response mask as a (B, T) bool tensor (non-zero = learnable).

    Raises:
        ValueError: the mask is not two-dimensional.

    """
    response_mask = _as_matrix(response_mask)
    return response_mask if response_mask.dtype == torch.bool else response_mask.bool()


def _as_matrix(response_mask: torch.Tensor) -> torch.Tensor:
    """The mask as a tensor, checked to be (B, T)."""
    if not isinstance(response_mask, torch.Tensor):
        response_mask = torch.as_tensor(response_mask)
    if response_mask.dim() != 2:
        raise ValueError(
            f"response_mask must have shape (B, T), got {tuple(response_mask.shape)}; "
            "pass one row per rollout"
        )
    return response_mask


def _word_aligned(response_mask: torch.Tensor) -> torch.Tensor:
    """(B, Tp) bool copy-or-view of the mask, Tp = T rounded up to a whole word, padded with 0."""
    batch, length = response_mask.shape
    padded = -(-length // _WORD) * _WORD
    if padded == length:
        mask = as_bool_mask(response_mask)
        return mask if mask.is_contiguous() else mask.contiguous()
    out = torch.zeros(batch, padded, dtype=torch.bool, device=response_mask.device)
    out[:, :length] = response_mask
    return out


def last_set_index(bits: torch.Tensor, nonzero: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) int64 index of the last True in each row of a word-aligned (B, Tp) bool; -1 if none.

    Args:
        bits: (B, Tp) bool, Tp a multiple of 8, contiguous.
        nonzero: (B, Tp/8) bool ``word != 0`` of ``bits``, when the caller already has it.

    """
    return _set_index(bits, nonzero, last=True)


def first_set_index(bits: torch.Tensor, nonzero: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) int64 index of the first True in each row of a word-aligned (B, Tp) bool; -1 if none.

    Args:
        bits: (B, Tp) bool, Tp a multiple of 8, contiguous.
        nonzero: (B, Tp/8) bool ``word != 0`` of ``bits``, when the caller already has it.

    """
    return _set_index(bits, nonzero, last=False)


def _set_index(bits: torch.Tensor, nonzero: torch.Tensor | None, *, last: bool) -> torch.Tensor:
    """First or last True per row: find the word (8 tokens), then the byte inside it."""
    length = bits.shape[1]
    if sys.byteorder != "little":  # the word view below assumes little-endian byte order
        pos = torch.arange(1, length + 1, device=bits.device)
        if last:
            return (bits * pos).amax(dim=1) - 1
        first = length - (bits * pos.flip(0)).amax(dim=1)
        return torch.where(bits.any(dim=1), first, -1)
    words = bits.view(torch.int64)
    if nonzero is None:
        nonzero = words.bool()  # a cast: several times faster than `words != 0`
    n = words.shape[1]
    if last:  # the largest position among non-zero words
        word_index = (nonzero * _positions(n, bits.device)).amax(dim=1).long()
    else:  # the smallest one, as the largest reversed position
        reverse = _positions(n, bits.device, reverse=True)
        word_index = (n - (nonzero * reverse).amax(dim=1).long()).clamp_max(n - 1)
    word = words.gather(1, word_index.unsqueeze(1)).squeeze(1)  # 0 when the row has no True
    index = _byte_index(host(word_index), host(word), last=last)
    return torch.from_numpy(index).to(bits.device)


def _byte_index(word_index: np.ndarray, word: np.ndarray, *, last: bool) -> np.ndarray:
    """Token index of the last (first) set byte of ``word``, the ``word_index``-th; -1 if none.

    Bytes are 0/1: the highest set byte k of a word is the number of powers 256**j (j >= 1) it
    reaches; for the lowest, apply the same count to its lowest set bit, 256**k.
    """
    probe = word if last else word & -word
    byte = (probe.reshape(-1, 1) >= _BYTE_STEPS).sum(axis=1)
    return np.where(word != 0, word_index * _WORD + byte, -1)


@cache
def _positions(n: int, device: torch.device, *, reverse: bool = False) -> torch.Tensor:
    """(n,) word positions 0..n-1 (n..1 reversed) in the narrowest dtype holding them."""
    dtype = _index_dtype(n)
    if reverse:
        return torch.arange(n, 0, -1, dtype=dtype, device=device)
    return torch.arange(n, dtype=dtype, device=device)


def _index_dtype(n: int) -> torch.dtype:
    """The narrowest integer dtype holding 0..n (narrow temporaries stream fewer bytes)."""
    return torch.int16 if n <= torch.iinfo(torch.int16).max else torch.int32


def row_counts(bits: torch.Tensor) -> torch.Tensor:
    """(B,) int64 number of True in each row of a word-aligned (B, Tp) bool.

    The row's int64 words are summed as integers, at most 255 at a time: each byte of such a sum
    counts the tokens at one place in the words, no byte overflowing into the next. The eight
    byte counts of a sum are then added with two masks, a shift and one multiply.
    """
    if sys.byteorder != "little":
        return torch.count_nonzero(bits, dim=1)
    return torch.from_numpy(_row_counts(bits)).to(bits.device)


def _row_counts(bits: torch.Tensor) -> np.ndarray:
    """:func:`row_counts` as a (B,) int64 numpy array (little-endian byte order)."""
    words = bits.view(torch.int64)
    n = words.shape[1]
    if n <= _BYTE_MAX:
        bytes_ = host(words.sum(dim=1, keepdim=True))
    else:
        parts = [words[:, i : i + _BYTE_MAX].sum(dim=1) for i in range(0, n, _BYTE_MAX)]
        bytes_ = host(torch.stack(parts, dim=1))
    lanes = (bytes_ & _EVEN_BYTES) + ((bytes_ >> 8) & _EVEN_BYTES)
    return ((lanes * _LANE_SUM) >> 48).sum(axis=1)


def suffix_masks(start: torch.Tensor, length: int) -> torch.Tensor:
    """(B, T) bool, row b True at positions >= start[b] (start clamped to [0, T]).

    Every such row is a window of one (2T,) pattern, ``T`` False then ``T`` True: ``unfold``
    views all T + 1 windows without copying, and ``index_select`` copies one per row. That is a
    row-wise memcpy, several times cheaper than comparing positions with the starts.
    """
    pattern = torch.zeros(2 * length, dtype=torch.bool, device=start.device)
    pattern[length:] = True
    windows = pattern.unfold(0, length, 1)  # (T + 1, T); row j is True from position T - j
    return windows.index_select(0, length - start.clamp(0, length))


def split_segments(response_mask: torch.Tensor | SegmentSplit) -> SegmentSplit:
    """Split every rollout of a batch into its tool and summary segments.

    Args:
        response_mask: (B, T) any dtype; non-zero marks learnable (policy-generated) tokens.
            A :class:`SegmentSplit` is returned as it is (a caller that already split the batch,
            e.g. with :meth:`SegmentSplit.without_summary`, passes it to an estimator).

    Returns:
        A :class:`SegmentSplit` whose masks are disjoint and whose union is the response mask.

    """
    if isinstance(response_mask, SegmentSplit):
        return response_mask
    response_mask = _as_matrix(response_mask)
    batch, length = response_mask.shape
    mask = _word_aligned(response_mask)
    padded = mask.shape[1]
    if padded == 0:
        empty = torch.zeros(batch, 0, dtype=torch.bool, device=mask.device)
        zeros = torch.zeros(batch, dtype=torch.long, device=mask.device)
        return SegmentSplit(empty, zeros, zeros, zeros > 0, zeros.sum())

    # A run starts where the mask steps from 0 to 1 (or at t = 0 when the row starts with a 1).
    starts = torch.empty_like(mask)
    starts[:, :1] = mask[:, :1]
    torch.gt(mask[:, 1:], mask[:, :-1], out=starts[:, 1:])
    if sys.byteorder != "little":
        last_start = host(last_set_index(starts))
        last_one = host(last_set_index(mask))
        first_one = host(first_set_index(mask))
    else:
        last_start, last_one, first_one = _run_ends(starts, mask)
    del starts  # freed before the next allocations: a smaller peak, fewer fresh pages

    # The summary is the last run, so its length follows from its two ends; a rollout has a tool
    # segment when it has a learnable token before that run.
    summary_len = np.where(last_one >= 0, last_one - last_start + 1, 0)
    has_tool = (first_one >= 0) & (first_one < last_start)
    device = mask.device
    summary_tokens = int(summary_len.sum())

    def tool_tokens() -> torch.Tensor:  # on the word-aligned mask, before trimming the padding
        return row_counts(mask).sum() - summary_tokens

    return SegmentSplit(
        mask[:, :length],
        torch.from_numpy(np.maximum(last_start, 0)).to(device),
        torch.from_numpy(summary_len).to(device),
        torch.from_numpy(has_tool).to(device),
        tool_tokens,
    )


def _run_ends(starts: torch.Tensor, mask: torch.Tensor) -> tuple[np.ndarray, ...]:
    """Last run start, last and first learnable token of word-aligned (B, Tp) bools (numpy).

    :func:`last_set_index` of ``starts`` and ``mask`` and :func:`first_set_index` of ``mask``,
    with one cast of the mask's words and one trip to the host.
    """
    n = mask.shape[1] // _WORD
    starts_words, words = starts.view(torch.int64), mask.view(torch.int64)
    nonzero = words.bool()
    last = _positions(n, mask.device)
    found = [
        (starts_words.bool() * last).amax(dim=1).long(),
        (nonzero * last).amax(dim=1).long(),
        (n - (nonzero * _positions(n, mask.device, reverse=True)).amax(dim=1).long()).clamp_max(
            n - 1
        ),
    ]
    index = torch.stack(found)
    word = torch.stack(
        [
            w.gather(1, i.unsqueeze(1)).squeeze(1)
            for w, i in zip((starts_words, words, words), found, strict=True)
        ]
    )
    index, word = host(index), host(word)
    return (
        _byte_index(index[0], word[0], last=True),
        _byte_index(index[1], word[1], last=True),
        _byte_index(index[2], word[2], last=False),
    )


def segment_masks(response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tool and summary masks of every rollout.

    Args:
        response_mask: (B, T) any dtype; non-zero marks learnable tokens.

    Returns:
        ``(tool_mask, summary_mask)``, each (B, T) bool: the summary is the last contiguous run of
        learnable tokens, the tool segment is every earlier run. They are disjoint and their union
        is the response mask.

    Example:
        >>> tool, summary = segment_masks(torch.tensor([[1, 1, 0, 1, 0, 1, 1, 0]]))
        >>> tool.int().tolist(), summary.int().tolist()
        ([[1, 1, 0, 1, 0, 0, 0, 0]], [[0, 0, 0, 0, 0, 1, 1, 0]])

    """
    split = split_segments(response_mask)
    return split.tool_mask, split.summary_mask
