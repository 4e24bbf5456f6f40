import sys

import pytest
import torch

from slca_exp.estimators import segment_masks
from slca_exp.estimators.segments import (
    first_set_index,
    last_set_index,
    row_counts,
    split_segments,
)
from tests.estimators.reference import reference_segment_masks


def masks(rows):
    tool, summary = segment_masks(torch.tensor(rows))
    return tool.int().tolist(), summary.int().tolist()


def test_no_run_has_neither_segment():
    assert masks([[0, 0, 0, 0]]) == ([[0, 0, 0, 0]], [[0, 0, 0, 0]])


def test_single_run_is_the_summary():
    assert masks([[0, 1, 1, 0]]) == ([[0, 0, 0, 0]], [[0, 1, 1, 0]])


def test_all_ones_is_one_summary_run():
    assert masks([[1, 1, 1, 1, 1]]) == ([[0, 0, 0, 0, 0]], [[1, 1, 1, 1, 1]])


def test_multiple_runs_last_is_summary_rest_is_tool():
    assert masks([[1, 1, 0, 1, 0, 0, 1, 1, 0]]) == (
        [[1, 1, 0, 1, 0, 0, 0, 0, 0]],
        [[0, 0, 0, 0, 0, 0, 1, 1, 0]],
    )


def test_runs_touching_both_boundaries():
    assert masks([[1, 0, 1]]) == ([[1, 0, 0]], [[0, 0, 1]])
    assert masks([[1, 0, 0, 0, 0, 0, 0, 0, 0, 1]]) == (
        [[1, 0, 0, 0, 0, 0, 0, 0, 0, 0]],
        [[0, 0, 0, 0, 0, 0, 0, 0, 0, 1]],
    )


def test_single_token_runs_and_rows_differ_within_a_batch():
    rows = [[1, 0, 1, 0, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 1, 1, 0]]
    assert masks(rows) == (
        [[1, 0, 1, 0, 1, 0, 0, 0], [0] * 8, [0] * 8],
        [[0, 0, 0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 1, 1, 0]],
    )


@pytest.mark.parametrize("length", [1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 130])
@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.int32, torch.float32])
def test_matches_reference_for_any_length_and_dtype(length, dtype):
    gen = torch.Generator().manual_seed(length)
    raw = torch.rand(12, length, generator=gen) < 0.6
    raw[0] = False
    raw[1] = True
    mask = raw.to(dtype)
    tool, summary = segment_masks(mask)
    ref_tool, ref_summary = reference_segment_masks(mask)
    assert torch.equal(tool, ref_tool) and torch.equal(summary, ref_summary)
    assert tool.dtype == torch.bool and tool.shape == mask.shape


def test_non_contiguous_input():
    base = torch.rand(6, 40, generator=torch.Generator().manual_seed(1)) < 0.5
    view = base[:, ::2]
    assert not view.is_contiguous()
    tool, summary = segment_masks(view)
    ref = reference_segment_masks(view)
    assert torch.equal(tool, ref[0]) and torch.equal(summary, ref[1])


def test_empty_batch_and_empty_rows():
    tool, summary = segment_masks(torch.zeros(0, 5))
    assert tool.shape == (0, 5) and summary.shape == (0, 5)
    tool, summary = segment_masks(torch.zeros(3, 0))
    assert tool.shape == (3, 0) and summary.shape == (3, 0)


def test_rejects_non_matrix():
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        segment_masks(torch.ones(4))


def test_token_counts_and_presence():
    split = split_segments(torch.tensor([[1, 1, 0, 1, 0, 1, 1, 1], [0, 1, 1, 0, 0, 0, 0, 0]]))
    assert split.has_tool.tolist() == [True, False]
    assert split.has_summary.tolist() == [True, True]
    assert int(split.tool_tokens) == 3 and int(split.summary_tokens) == 5


def test_word_reductions_match_the_plain_ones(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    bits = torch.rand(20, 64, generator=gen) < 0.05
    bits[0] = False
    fast = (last_set_index(bits), first_set_index(bits))
    monkeypatch.setattr(sys, "byteorder", "big")  # forces the portable path
    plain = (last_set_index(bits), first_set_index(bits))
    assert torch.equal(fast[0], plain[0]) and torch.equal(fast[1], plain[1])
    assert fast[0][0] == -1 and fast[1][0] == -1


@pytest.mark.parametrize("length", [8, 2040, 2048, 4096, 10000])
def test_row_counts_match_count_nonzero(length, monkeypatch):
    gen = torch.Generator().manual_seed(length)
    density = torch.tensor([[0.0], [0.1], [0.5], [0.9], [1.0], [1.0]])
    bits = torch.rand(6, length, generator=gen) < density
    fast = row_counts(bits)  # word sums of at most 255 words: one sum or several per row
    monkeypatch.setattr(sys, "byteorder", "big")  # forces the portable path
    assert torch.equal(fast, bits.sum(dim=1)) and torch.equal(row_counts(bits), fast)


def test_long_rows_match_reference():
    gen = torch.Generator().manual_seed(5)
    raw = torch.rand(5, 5003, generator=gen) < torch.tensor([[0.002], [0.3], [0.97], [1], [0]])
    split = split_segments(raw)
    ref_tool, ref_summary = reference_segment_masks(raw)
    assert torch.equal(split.tool_mask, ref_tool) and torch.equal(split.summary_mask, ref_summary)
    assert int(split.tool_tokens) == int(ref_tool.sum())
    assert split.has_tool.tolist() == ref_tool.any(dim=1).tolist()
