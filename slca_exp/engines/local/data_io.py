"""What the local engine needs from the data and backbone packages, in one place."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

from slca_exp.backbones import Backbone, load_backbone
from slca_exp.backbones.chat import render_prompt, render_text, tokenize_trajectory, tool_turn_text
from slca_exp.config.schema import RunConfig
from slca_exp.data.splits import Split, load_splits
from slca_exp.engines.local.rollout import row_tools
from slca_exp.tracking.mlflow import output_root

__all__ = ["backbone", "corpus", "load", "render_prompt", "sft_examples", "tool_turn_text"]


def load(config: RunConfig) -> dict[str, Split]:
    """The run's splits (``sft`` when the data has one, ``train``, ``val``), validated."""
    return load_splits(config)


def corpus(splits: dict[str, Split]) -> list[str]:
    """Texts a built-in tokenizer is trained on: every row rendered with the chat template."""
    texts = []
    for split in splits.values():
        for row in split.rows:
            tools = row_tools(row)
            if "messages" in row:
                texts.append(render_text(json.loads(row["messages"]), tools))
            texts.append(render_text(list(row["prompt"]), tools))
    return texts


def backbone(config: RunConfig, splits: dict[str, Split], device: torch.device) -> Backbone:
    """The policy and its tokenizer (a built-in one is trained on the splits and cached)."""
    return load_backbone(
        config.backbone,
        corpus=lambda: corpus(splits),
        cache_root=output_root(config.tracking) / "cache",
        seed=config.seed,
        device=str(device),
    )


def sft_examples(
    tokenizer: Any,  # noqa: ANN401
    rows: Sequence[dict[str, Any]],
    max_len: int,
) -> list[tuple[list[int], list[int]]]:
    """``(input_ids, loss_mask)`` of every gold trajectory (loss on assistant tokens only)."""
    out = []
    for row in rows:
        messages = json.loads(row["messages"])
        ids, mask = tokenize_trajectory(tokenizer, messages, row_tools(row), max_len)
        out.append((list(ids), list(mask)))
    return out
