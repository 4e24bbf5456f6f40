"""Vectorised per-group statistics: dense group ids, presence-filtered normalisation, stats.

Group ids are mapped to dense integers once; per-group counts, sums and squared deviations are
then scatter-adds over the batch, so the cost is a handful of (B,) passes whatever the number of
groups. Sums run in float64: the group means and unbiased stds are then exact to float32
precision, which is what the estimators return.

These are per-rollout vectors, so they are computed with numpy on the host
(``slca_exp.estimators.host``). The scatter-adds (``np.bincount`` with weights) add in batch
order, as ``torch.Tensor.index_add_`` does; the reductions whose order decides the last bit, and
the square roots, run through torch: the values are bit for bit those of the same formulas on
torch tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from slca_exp.core import names
from slca_exp.estimators.host import host

GroupIds = torch.Tensor | np.ndarray | Sequence[object]

_STAT_KEYS = [
    [names.adv(segment, s) for s in names.ADV_STATS]
    + [
        names.present_frac(segment),
        names.zeroed_group_frac(segment),
        names.tokens_mean(segment),
    ]
    for segment in names.SEGMENTS
]
_BIG = float(np.finfo(np.float64).max)


def dense_group_index(
    group_ids: GroupIds, batch_size: int, device: torch.device | str | None = None
) -> tuple[torch.Tensor, int]:
    """Map arbitrary group labels to dense integers ``0..G-1``.

    Args:
        group_ids: (B,) labels: an integer (or float) tensor, a numpy array of numbers, strings or
            objects (uuids, ...), or a list of them. Labels that are not all numbers are compared
            by their string form (so 1 and "1" are one group).
        batch_size: B, checked against the number of labels.
        device: where the result lives.

    Returns:
        ``(index, G)``: (B,) int64 dense ids and the number of distinct groups.

    Raises:
        ValueError: the labels are not one per rollout.

    """
    codes, groups = dense_group_codes(group_ids, batch_size)
    return torch.from_numpy(codes).to(device=device), groups


def dense_group_codes(group_ids: GroupIds, batch_size: int) -> tuple[np.ndarray, int]:
    """:func:`dense_group_index` as a (B,) int64 numpy array (what the estimators compute with).

    Raises:
        ValueError: the labels are not one per rollout.

    """
    if isinstance(group_ids, torch.Tensor):
        labels = group_ids.detach()
        if labels.dim() != 1 or labels.shape[0] != batch_size:
            raise ValueError(_shape_message(tuple(labels.shape), batch_size))
        _, inverse = torch.unique(labels, sorted=True, return_inverse=True)
        return _counted(host(inverse))
    array = np.asarray(group_ids)
    if array.ndim != 1 or array.shape[0] != batch_size:
        raise ValueError(_shape_message(array.shape, batch_size))
    if array.dtype.kind in "biuf":
        _, inverse = torch.unique(torch.from_numpy(array), sorted=True, return_inverse=True)
        return _counted(inverse.numpy())
    return _counted(_string_codes(array))


def _string_codes(array: np.ndarray) -> np.ndarray:
    """Codes of labels compared by their string form.

    Labels that are all ``str`` (uids) are numbered in order of first appearance (dict lookups
    in C); anything else is turned into strings first and sorted.
    """
    labels = array.tolist()
    first = dict.fromkeys(labels)
    if all(type(label) is str for label in first):
        number = {label: i for i, label in enumerate(first)}
        return np.fromiter(map(number.__getitem__, labels), np.int64, len(labels))
    return np.unique(array.astype(str), return_inverse=True)[1].reshape(-1)


def _counted(codes: np.ndarray) -> tuple[np.ndarray, int]:
    codes = codes.astype(np.int64, copy=False)
    return codes, int(codes.max()) + 1 if codes.size else 0


def _shape_message(shape: tuple[int, ...], batch_size: int) -> str:
    return (
        f"group_ids must hold one label per rollout, shape ({batch_size},); got shape {shape}. "
        "Pass the uid of each rollout's prompt."
    )


def as_scores(score: torch.Tensor | Sequence[float], batch_size: int, name: str) -> np.ndarray:
    """Return a (B,) float64 copy of a score vector, checking its shape.

    Raises:
        ValueError: the scores are not one per rollout.

    """
    t = torch.as_tensor(score).detach()
    if t.dim() != 1 or t.shape[0] != batch_size:
        raise ValueError(
            f"{name} must hold one score per rollout, shape ({batch_size},); got "
            f"{tuple(t.shape)}. Reduce token-level rewards to one scalar per rollout first."
        )
    return host(t.to(torch.float64))


SmallGroup = Literal["zero", "passthrough"]


def group_normalize(
    scores: np.ndarray,
    present: np.ndarray,
    index: np.ndarray,
    num_groups: int,
    *,
    norm_by_std: bool,
    eps: float,
    small_group: SmallGroup | Sequence[SmallGroup],
) -> np.ndarray:
    """Normalise scores within each group over its present members only.

    Several score vectors (one per segment) are normalised in one pass: row s of ``scores`` uses
    groups ``s * G .. s * G + G - 1`` of one flat scatter.

    Args:
        scores: (S, B) float64; values of absent members are ignored (they may be NaN).
        present: (S, B) bool, which members take part.
        index: (B,) int64 dense group ids.
        num_groups: G.
        norm_by_std: divide by (unbiased std + eps); otherwise only subtract the mean (Dr.GRPO).
        eps: added to the std.
        small_group: what a group with fewer than two present members gets, for all rows or one
            per row. ``"zero"``: advantage 0 (SLCA-GRPO's guard). ``"passthrough"``: mean 0 and
            std 1, i.e. the raw score (verl's GRPO rule for singleton groups).

    Returns:
        (S, B) float64 advantages, 0 for absent members, never NaN.

    """
    segments, batch = scores.shape
    rules = [small_group] * segments if isinstance(small_group, str) else list(small_group)
    passthrough = np.array([[r == "passthrough"] for r in rules])
    flat = (index + num_groups * np.arange(segments).reshape(-1, 1)).reshape(-1)
    size = segments * num_groups
    weight = present.astype(np.float64).reshape(-1)
    with np.errstate(all="ignore"):  # overflowing or absent scores are handled explicitly
        values = np.where(present, scores, 0.0).reshape(-1)
        count = _scatter_add(flat, weight, size)
        mean = _scatter_add(flat, values, size) / np.maximum(count, 1.0)
        deviation = (values - mean[flat]) * weight
        sq = _scatter_add(flat, deviation * deviation, size)
        small = (count < 2)[flat].reshape(segments, batch)
        silenced = ~present
        if passthrough.any():
            keep_raw = (small & passthrough).reshape(-1)
            deviation = np.where(keep_raw, values, deviation)
            silenced |= small & ~passthrough
        else:
            keep_raw = None
            silenced |= small
        if norm_by_std:
            std = _sqrt(sq / np.maximum(count - 1.0, 1.0))[flat]
            denom = (std if keep_raw is None else np.where(keep_raw, 1.0, std)) + eps
            adv = np.where(denom > 0, deviation / denom, 0.0)
        else:
            adv = deviation
    return finite(np.where(silenced.reshape(-1), 0.0, adv)).reshape(segments, batch)


def finite(values: np.ndarray) -> np.ndarray:
    """``values`` with NaN as 0 and infinities as the largest finite floats (``nan_to_num``)."""
    if np.isfinite(values).all():  # the usual case, without nan_to_num's own overhead
        return values
    return np.nan_to_num(values, nan=0.0)


def _scatter_add(index: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """(size,) float64 sums of ``values`` by ``index``, added in order (as ``index_add_`` does)."""
    return np.bincount(index, weights=values, minlength=size).astype(np.float64, copy=False)


def check_hparams(*, eps: float, **weights: float) -> None:
    """Refuse hyper-parameters that would make advantages non-finite.

    Raises:
        ValueError: ``eps`` is negative or not finite, or a weight is not finite.

    """
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0 (1e-6 is the usual value), got {eps}")
    for key, value in weights.items():
        if not math.isfinite(value):
            raise ValueError(f"{key} must be a finite number, got {value}")


def segment_stats(
    adv: torch.Tensor | np.ndarray,
    present: torch.Tensor | np.ndarray,
    has_segment: torch.Tensor | np.ndarray,
    tokens: torch.Tensor | np.ndarray | Sequence[int],
    index: torch.Tensor | np.ndarray,
    num_groups: int,
) -> dict[str, float]:
    """The per-segment metrics of one estimator call, for the tool and the summary segment.

    Args:
        adv: (2, B) advantage routed to each segment (after weighting); row 0 tool, 1 summary.
        present: (2, B) bool, rollouts whose segment took part in normalisation.
        has_segment: (2, B) bool, rollouts with at least one token of the segment.
        tokens: (2,) total number of each segment's tokens in the batch.
        index: (B,) int64 dense group ids.
        num_groups: G.

    Returns:
        ``adv/{segment}/*`` over present rollouts, ``segment/{segment}/present_frac``,
        ``zeroed_group_frac`` and ``tokens/mean``; every value finite (0 when nothing is present).

    """
    adv = host(adv).astype(np.float64)
    present, has_segment = host(present), host(has_segment)
    batch = adv.shape[1]
    p = present.astype(np.float64)
    n = p.sum(axis=1)
    nf = np.maximum(n, 1.0)
    with np.errstate(all="ignore"):  # infinite advantages saturate below
        sums = _row_sums(np.concatenate([adv * p, np.abs(adv) * p]))
        mean, abs_mean = sums[:2] / nf, sums[2:] / nf
        var = _row_sums(((adv - mean.reshape(-1, 1)) * p) ** 2) / np.maximum(nf - 1.0, 1.0)
        std = np.where(n > 1, _sqrt(var), 0.0)
    if batch:
        lo = np.where(present, adv, _BIG).min(axis=1)
        hi = np.where(present, adv, -_BIG).max(axis=1)
    else:
        lo = hi = np.zeros(2)
    tokens = np.array([int(t) for t in tokens], dtype=np.float64)
    token_mean = tokens / np.maximum(has_segment.sum(axis=1), 1)
    flat = (host(index) + num_groups * np.arange(2).reshape(-1, 1)).reshape(-1)
    signals = ((adv != 0) & present).astype(np.float64).reshape(-1)
    signal = _scatter_add(flat, signals, 2 * num_groups)
    zeroed = (signal.reshape(2, -1) == 0).mean(axis=1) if num_groups else n * 0
    some = n > 0
    columns = np.stack(
        [
            mean,
            std,
            abs_mean,
            np.where(some, lo, 0.0),
            np.where(some, hi, 0.0),
            n / batch if batch else n * 0,
            zeroed,
            token_mean,
        ],
        axis=1,
    )
    values = finite(columns).tolist()
    stats: dict[str, float] = {}
    for keys, row in zip(_STAT_KEYS, values, strict=True):
        stats.update(zip(keys, row, strict=True))
    return stats


def _row_sums(rows: np.ndarray) -> np.ndarray:
    """Row sums as ``torch.sum`` computes them (the order of a float reduction is part of it)."""
    return torch.from_numpy(np.ascontiguousarray(rows)).sum(dim=1).numpy()


def _sqrt(values: np.ndarray) -> np.ndarray:
    """Square roots as ``torch.sqrt`` computes them (its CPU kernel can round the last bit off)."""
    return torch.from_numpy(values).sqrt().numpy()
