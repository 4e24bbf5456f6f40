"""Per-rollout arithmetic on the host: the same floats as the formulas written in torch.

The group statistics and metrics run with numpy on (B,) vectors; their promise is that not one
bit changes against the formulas evaluated with torch tensors (below, a direct transcription):
scatter-adds in batch order, torch's reductions and square roots where the order or the rounding
of a library could differ.
"""

import math
import uuid

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.core import names
from slca_exp.estimators.group import dense_group_codes, group_normalize, segment_stats

VALUES = st.one_of(
    st.floats(-1e3, 1e3, allow_nan=False),
    st.sampled_from([0.0, -0.0, 0.25, 1.0, 1e300, -1e300, float("nan"), float("inf")]),
)


def torch_normalize(scores, present, index, groups, *, norm_by_std, eps, small_group):
    """group_normalize's formulas with torch tensors."""
    segments, batch = scores.shape
    rules = [small_group] * segments if isinstance(small_group, str) else list(small_group)
    passthrough = torch.tensor([r == "passthrough" for r in rules])
    flat = (index + groups * torch.arange(segments).unsqueeze(1)).view(-1)
    weight = present.to(torch.float64).view(-1)
    values = torch.where(present, scores, 0.0).view(-1)
    count = torch.zeros(segments * groups, dtype=torch.float64).index_add_(0, flat, weight)
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


def torch_stats(adv, present, has, tokens, index, groups):
    """segment_stats' formulas with torch tensors: (2, 8) rows of values, keys' order."""
    adv = adv.to(torch.float64)
    batch = adv.shape[1]
    p = present.to(torch.float64)
    n = p.sum(dim=1)
    nf = n.clamp_min(1.0)
    mean = (adv * p).sum(dim=1) / nf
    var = (((adv - mean.unsqueeze(1)) * p) ** 2).sum(dim=1) / (nf - 1.0).clamp_min(1.0)
    big = torch.finfo(torch.float64).max
    lo = torch.where(present, adv, big).amin(dim=1) if batch else torch.zeros(2)
    hi = torch.where(present, adv, -big).amax(dim=1) if batch else torch.zeros(2)
    flat = (index + groups * torch.arange(2).unsqueeze(1)).view(-1)
    signal = torch.zeros(2 * groups, dtype=torch.float64)
    signal.index_add_(0, flat, ((adv != 0) & present).to(torch.float64).view(-1))
    zeroed = (signal.view(2, -1) == 0).to(torch.float64).mean(dim=1) if groups else n * 0
    columns = [
        mean,
        torch.where(n > 1, var.sqrt(), 0.0),
        (adv.abs() * p).sum(dim=1) / nf,
        torch.where(n > 0, lo, 0.0),
        torch.where(n > 0, hi, 0.0),
        p.mean(dim=1) if batch else n * 0,
        zeroed,
        tokens.to(torch.float64) / has.sum(dim=1).clamp_min(1),
    ]
    stacked = torch.nan_to_num(torch.stack(columns, dim=1), nan=0.0, posinf=big, neginf=-big)
    return stacked.tolist()


@st.composite
def segment_batches(draw):
    """(scores (S, B) float64, present (S, B) bool, dense ids (B,), G) for S = 1 or 2."""
    segments = draw(st.integers(1, 2))
    batch = draw(st.integers(0, 40))
    labels = draw(st.lists(st.integers(0, 6), min_size=batch, max_size=batch))
    _, index = np.unique(np.array(labels, dtype=np.int64), return_inverse=True)
    flat = draw(st.lists(VALUES, min_size=segments * batch, max_size=segments * batch))
    present = draw(st.lists(st.booleans(), min_size=segments * batch, max_size=segments * batch))
    scores = np.array(flat, dtype=np.float64).reshape(segments, batch)
    present = np.array(present, dtype=bool).reshape(segments, batch) & np.isfinite(scores)
    return scores, present, index.reshape(-1).astype(np.int64), len(set(labels))


def bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).view(np.int64)


@settings(max_examples=100, deadline=None)
@given(
    batch=segment_batches(),
    norm=st.booleans(),
    eps=st.sampled_from([1e-6, 0.0, 0.5]),
    rules=st.sampled_from(["zero", "passthrough", ("passthrough", "zero"), ("zero", "zero")]),
)
def test_group_normalize_gives_the_torch_formulas_floats(batch, norm, eps, rules):
    scores, present, index, groups = batch
    if not isinstance(rules, str):
        rules = rules[: scores.shape[0]] if scores.shape[0] == 2 else rules[:1]
    kw = {"norm_by_std": norm, "eps": eps, "small_group": rules}
    got = group_normalize(scores, present, index, groups, **kw)
    expected = torch_normalize(
        torch.from_numpy(scores), torch.from_numpy(present), torch.from_numpy(index), groups, **kw
    )
    assert np.array_equal(bits(got), bits(expected.numpy()))


@settings(max_examples=100, deadline=None)
@given(batch=segment_batches(), has_extra=st.lists(st.booleans(), min_size=80, max_size=80))
def test_segment_stats_give_the_torch_formulas_floats(batch, has_extra):
    scores, present, index, groups = batch
    if scores.shape[0] == 1:
        scores, present = np.repeat(scores, 2, axis=0), np.repeat(present, 2, axis=0)
    adv = np.clip(np.nan_to_num(scores), -3e38, 3e38).astype(np.float32)
    has = present | np.array(has_extra[: adv.size], dtype=bool).reshape(adv.shape)
    tokens = torch.tensor([17, 5])
    got = segment_stats(adv, present, has, tokens, index, groups)
    expected = torch_stats(
        torch.from_numpy(adv),
        torch.from_numpy(present),
        torch.from_numpy(has),
        tokens,
        torch.from_numpy(index),
        groups,
    )
    keys = [
        [names.adv(s, k) for k in names.ADV_STATS]
        + [names.present_frac(s), names.zeroed_group_frac(s), names.tokens_mean(s)]
        for s in names.SEGMENTS
    ]
    for segment_keys, row in zip(keys, expected, strict=True):
        assert [got[k] for k in segment_keys] == row
    assert all(math.isfinite(v) for v in got.values())


LABELS = st.one_of(
    st.sampled_from(["a", "b", "1", "uid-7", ""]),
    st.integers(0, 3),
    st.sampled_from([1.0, 2.5, None, True]),
    st.builds(lambda i: uuid.UUID(int=i), st.integers(0, 2)),
)


@settings(max_examples=100, deadline=None)
@given(labels=st.lists(LABELS, max_size=30), strings=st.booleans())
def test_group_codes_compare_labels_by_their_string_form(labels, strings):
    if strings:
        labels = [str(x) for x in labels]
    array = np.array(labels, dtype=object)
    codes, groups = dense_group_codes(array, len(labels))
    assert codes.dtype == np.int64 and codes.shape == (len(labels),)
    assert sorted(set(codes.tolist())) == list(range(groups))
    for i, x in enumerate(labels):
        for j, y in enumerate(labels):
            assert (codes[i] == codes[j]) == (str(x) == str(y)), (x, y)


def test_group_codes_of_plain_lists_and_tensors():
    assert dense_group_codes(["b", "a", "b"], 3)[1] == 2
    codes, groups = dense_group_codes(torch.tensor([5, 3, 5, 9]), 4)
    assert groups == 3 and codes[0] == codes[2] != codes[1]
    codes, groups = dense_group_codes(np.array([1, "1", 1.0], dtype=object), 3)
    assert groups == 2 and codes[0] == codes[1] != codes[2]
