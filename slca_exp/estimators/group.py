"""Vectorised per-group statistics: dense group ids, presence-filtered normalisation, stats.

Group ids are mapped to dense integers once; per-group counts, sums and squared deviations are
then ``index_add_`` scatters over the batch, so the cost is a handful of (B,) passes whatever the
number of groups. Sums run in float64: the group means and unbiased stds are then exact to
float32 precision, which is what the estimators return.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from slca_exp.tracking import names

GroupIds = torch.Tensor | np.ndarray | Sequence[object]


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
    if isinstance(group_ids, torch.Tensor):
        labels = group_ids.detach()
        if labels.dim() != 1 or labels.shape[0] != batch_size:
            raise ValueError(_shape_message(tuple(labels.shape), batch_size))
        _, inverse = torch.unique(labels, sorted=True, return_inverse=True)
        return inverse.to(device=device, dtype=torch.long), _num_groups(inverse)
    array = np.asarray(group_ids)
    if array.ndim != 1 or array.shape[0] != batch_size:
        raise ValueError(_shape_message(array.shape, batch_size))
    if array.dtype.kind in "biuf":
        _, inverse = torch.unique(torch.from_numpy(array), sorted=True, return_inverse=True)
    else:
        # Strings, uuids, mixed objects: compared by their string form (a fixed-width unicode
        # array sorts in C, about twice as fast as sorting Python objects).
        _, inverse_np = np.unique(array.astype(str), return_inverse=True)
        inverse = torch.from_numpy(inverse_np.reshape(-1).astype(np.int64, copy=False))
    return inverse.to(device=device, dtype=torch.long), _num_groups(inverse)


def _num_groups(inverse: torch.Tensor) -> int:
    return int(inverse.max().item()) + 1 if inverse.numel() else 0


def _shape_message(shape: tuple[int, ...], batch_size: int) -> str:
    return (
        f"group_ids must hold one label per rollout, shape ({batch_size},); got shape {shape}. "
        "Pass the uid of each rollout's prompt."
    )


def as_scores(score: torch.Tensor | Sequence[float], batch_size: int, name: str) -> torch.Tensor:
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
    return t.to(torch.float64)


SmallGroup = Literal["zero", "passthrough"]


def group_normalize(
    scores: torch.Tensor,
    present: torch.Tensor,
    index: torch.Tensor,
    num_groups: int,
    *,
    norm_by_std: bool,
    eps: float,
    small_group: SmallGroup | Sequence[SmallGroup],
) -> torch.Tensor:
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
    passthrough = torch.tensor([r == "passthrough" for r in rules], device=scores.device)
    flat = (index + num_groups * torch.arange(segments, device=index.device).unsqueeze(1)).view(-1)
    weight = present.to(torch.float64).view(-1)
    values = torch.where(present, scores, 0.0).view(-1)
    count = torch.zeros(segments * num_groups, dtype=torch.float64, device=scores.device)
    count.index_add_(0, flat, weight)
    mean = torch.zeros_like(count).index_add_(0, flat, values) / count.clamp_min(1.0)
    deviation = (values - mean[flat]) * weight
    sq = torch.zeros_like(count).index_add_(0, flat, deviation * deviation)
    std = (sq / (count - 1.0).clamp_min(1.0)).sqrt()[flat]

    small = (count[flat] < 2).view(segments, batch)
    keep_raw = (small & passthrough.unsqueeze(1)).view(-1)
    deviation = torch.where(keep_raw, values, deviation)
    if norm_by_std:
        denom = torch.where(keep_raw, 1.0, std) + eps
        adv = torch.where(denom > 0, deviation / denom, 0.0)
    else:
        adv = deviation
    silenced = (small & ~passthrough.unsqueeze(1)) | ~present
    adv = torch.where(silenced.view(-1), 0.0, adv)
    return torch.nan_to_num(adv, nan=0.0).view(segments, batch)


def check_hparams(*, eps: float, **weights: float) -> None:
    """Refuse hyper-parameters that would make advantages non-finite.

    Raises:
        ValueError: ``eps`` is negative or not finite, or a weight is not finite.

    """
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0 (1e-6 is the usual value), got {eps}")
    for key, value in weights.items():
        if not np.isfinite(value):
            raise ValueError(f"{key} must be a finite number, got {value}")


def segment_stats(
    adv: torch.Tensor,
    present: torch.Tensor,
    has_segment: torch.Tensor,
    tokens: torch.Tensor,
    index: torch.Tensor,
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
    adv = adv.to(torch.float64)
    batch = adv.shape[1]
    p = present.to(torch.float64)
    n = p.sum(dim=1)
    nf = n.clamp_min(1.0)
    mean = (adv * p).sum(dim=1) / nf
    var = (((adv - mean.unsqueeze(1)) * p) ** 2).sum(dim=1) / (nf - 1.0).clamp_min(1.0)
    big = torch.finfo(torch.float64).max
    if batch:
        lo = torch.where(present, adv, big).amin(dim=1)
        hi = torch.where(present, adv, -big).amax(dim=1)
    else:
        lo = hi = torch.zeros(2, dtype=torch.float64)
    token_mean = tokens.to(torch.float64) / has_segment.sum(dim=1).clamp_min(1)
    flat = (index + num_groups * torch.arange(2, device=index.device).unsqueeze(1)).view(-1)
    signal = torch.zeros(2 * num_groups, dtype=torch.float64, device=adv.device)
    signal.index_add_(0, flat, ((adv != 0) & present).to(torch.float64).view(-1))
    zeroed = (signal.view(2, -1) == 0).to(torch.float64).mean(dim=1) if num_groups else n * 0
    some = n > 0
    columns = torch.stack(
        [
            mean,
            torch.where(n > 1, var.sqrt(), 0.0),
            (adv.abs() * p).sum(dim=1) / nf,
            torch.where(some, lo, 0.0),
            torch.where(some, hi, 0.0),
            p.mean(dim=1) if batch else n * 0,
            zeroed,
            token_mean,
        ],
        dim=1,
    )
    values = torch.nan_to_num(columns, nan=0.0, posinf=big, neginf=-big).tolist()
    stats: dict[str, float] = {}
    for segment, row in zip(names.SEGMENTS, values, strict=True):
        keys = [names.adv(segment, s) for s in names.ADV_STATS] + [
            names.present_frac(segment),
            names.zeroed_group_frac(segment),
            names.tokens_mean(segment),
        ]
        stats.update(zip(keys, row, strict=True))
    return stats
