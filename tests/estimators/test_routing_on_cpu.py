"""Token advantages: each segment's value on its own tokens, bit for bit, however it is tiled.

``fill_advantages`` multiplies the widened mask tile by tile and scatters what is left of each
summary run; its promise is the plain formula ``where(summary, summary_adv, mask * fill)`` with
``fill`` the row's tool value (its summary value without a tool segment), where a row whose two
values compare equal keeps ``mask * fill`` throughout: the same float on every token, the sign
of zero included, for any tile width.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.estimators import routing
from slca_exp.estimators.segments import split_segments

VALUES = st.sampled_from([0.0, -0.0, 0.5, -0.5, 1.25, -3.0, 3e38])


@st.composite
def rollouts(draw):
    """(mask (B, T) int64, tool values (B,), summary values (B,), rows without a summary)."""
    batch = draw(st.integers(1, 12))
    rows = []
    for _ in range(batch):
        turns = draw(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 40)), max_size=4))
        row = [v for gap, n in turns for v in [0] * gap + [1] * n]
        rows.append(row + [0] * draw(st.integers(0, 20)))
    width = max(1, max(map(len, rows)))
    mask = torch.zeros(batch, width, dtype=torch.int64)
    for i, row in enumerate(rows):
        mask[i, : len(row)] = torch.tensor(row, dtype=torch.int64)
    tool = draw(st.lists(VALUES, min_size=batch, max_size=batch))
    summary = [
        t if draw(st.booleans()) else draw(VALUES) for t in tool
    ]  # equal values are common: GRPO, or a zero-weight segment
    cut = draw(st.lists(st.booleans(), min_size=batch, max_size=batch))
    return mask, np.float32(tool), np.float32(summary), np.array(cut)


def plain(split, tool, summary):
    fill = torch.where(split.has_tool, torch.from_numpy(tool), torch.from_numpy(summary))
    spread = split.mask.to(torch.float32) * fill.unsqueeze(1)
    differ = (fill != torch.from_numpy(summary)).unsqueeze(1)
    return torch.where(split.summary_mask & differ, torch.from_numpy(summary).unsqueeze(1), spread)


@settings(max_examples=150, deadline=None)
@given(batch=rollouts(), tile=st.sampled_from([1, 2, 3, 8, 16, 128]), cut=st.booleans())
def test_fill_is_the_plain_formula_bit_for_bit_for_any_tile(batch, tile, cut):
    mask, tool, summary, rows = batch
    split = split_segments(mask)
    if cut:  # the corrected mask rule: these rollouts end on a tool call, all tool
        split = split.without_summary(torch.from_numpy(rows))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(routing, "TILE", tile)
        got = routing.fill_advantages(split, tool, summary)
    expected = plain(split, tool, summary)
    assert got.dtype == torch.float32 and got.shape == mask.shape
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))


def test_run_positions_lists_every_run():
    first, lengths = np.array([3, 10, 40, 7]), np.array([2, 0, 3, 1])
    got = routing.run_positions(first, lengths, int(lengths.sum()))
    assert got.tolist() == [3, 4, 40, 41, 42, 7]
