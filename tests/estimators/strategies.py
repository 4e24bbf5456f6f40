"""Hypothesis strategies: batches of rollouts with group ids and scores."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

SCORE = st.one_of(
    st.floats(-10, 10, allow_nan=False, width=32),
    st.sampled_from([0.0, 0.25, 0.5, 1.0, float("nan")]),
)


@st.composite
def batches(draw, max_batch: int = 12, max_len: int = 20):
    """(mask (B, T) int64, group ids (B,) int64, tool (B,), summary (B,), total (B,))."""
    b = draw(st.integers(1, max_batch))
    t = draw(st.integers(1, max_len))
    bits = draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=b, max_size=b))
    groups = draw(st.lists(st.integers(0, 3), min_size=b, max_size=b))

    def scores():
        return torch.tensor(draw(st.lists(SCORE, min_size=b, max_size=b)), dtype=torch.float32)

    return torch.tensor(bits, dtype=torch.int64), torch.tensor(groups), scores(), scores(), scores()
