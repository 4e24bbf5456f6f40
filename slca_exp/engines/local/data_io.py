"""What the local engine needs from the data and backbone packages, in one place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from slca_exp.backbones import Backbone
from slca_exp.backbones.chat import render_prompt, tokenize_trajectory, tool_turn_text
from slca_exp.config.schema import RunConfig
from slca_exp.core.rows import Row
from slca_exp.data.splits import Split, load_splits
from slca_exp.engines.common import corpus, run_backbone

__all__ = ["backbone", "corpus", "load", "render_prompt", "sft_examples", "tool_turn_text"]


def load(config: RunConfig) -> dict[str, Split]:
    """The run's splits (``sft`` when the data has one, ``train``, ``val``), validated."""
    return load_splits(config)


def backbone(config: RunConfig, splits: dict[str, Split], device: torch.device) -> Backbone:
    """The policy and its tokenizer (a built-in one is trained on the splits and cached)."""
    return run_backbone(config, splits, str(device))


def sft_examples(
    tokenizer: Any,  # noqa: ANN401
    rows: Sequence[dict[str, Any]],
    max_len: int,
) -> list[tuple[list[int], list[int]]]:
    """``(input_ids, loss_mask)`` of every gold trajectory (loss on assistant tokens only).

    Raises:
        ValueError: a row without ``messages`` (the SFT split is checked when it is loaded).

    """
    out = []
    for i, row in enumerate(map(Row, rows)):
        messages = row.messages()
        if messages is None:
            raise ValueError(f"SFT row {i} has no messages (its gold trajectory)")
        ids, mask = tokenize_trajectory(tokenizer, messages, row.tools(), max_len)
        out.append((list(ids), list(mask)))
    return out
