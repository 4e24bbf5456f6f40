"""Stage 1: supervised fine-tuning on the gold trajectories of the SFT split.

Teacher forcing over the whole rendered trajectory, with the loss (token-mean cross-entropy) on the
assistant's own tokens only: tool calls, the final reply and their end-of-turn tokens. System,
user and tool-response tokens are context, as in the paper's LLaMA-Factory warm start.

The result is cached by what determines it (backbone checkpoint, SFT split hash, SFT settings,
seed), so every run of a sweep over rewards or estimators starts from the same SFT weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from slca_exp.config.schema import SFTConfig


def sft_key(backbone_path: Path, split_sha256: str, cfg: SFTConfig, seed: int) -> str:
    """The cache key of an SFT result (hex, 16 characters)."""
    blob = json.dumps(
        {
            "backbone": str(backbone_path),
            "split": split_sha256,
            "sft": {k: getattr(cfg, k) for k in ("steps", "batch_size", "lr", "max_len")},
            "seed": seed,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def train_sft(
    model: torch.nn.Module,
    examples: Sequence[tuple[list[int], list[int]]],
    cfg: SFTConfig,
    *,
    seed: int,
    pad_id: int,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Fine-tune ``model`` in place on ``(input_ids, loss_mask)`` examples.

    Args:
        model: the causal LM.
        examples: tokenised trajectories and their loss masks (1 on assistant tokens).
        cfg: ``engine.sft``.
        seed: shuffling seed.
        pad_id: padding token id.
        on_step: called with (step, loss) after every optimizer step.

    Returns:
        The loss of every step.

    """
    if not examples:
        raise ValueError("the SFT split has no trajectories; set engine.sft.enabled=false")
    device = next(model.parameters()).device
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(1, cfg.steps // 10))
    )
    order: list[int] = []
    losses = []
    model.train()
    for step in range(cfg.steps):
        if len(order) < cfg.batch_size:
            order += rng.sample(range(len(examples)), len(examples))
        picked, order = order[: cfg.batch_size], order[cfg.batch_size :]
        ids, attn, labels = collate([examples[i] for i in picked], pad_id, cfg.max_len)
        ids, attn, labels = ids.to(device), attn.to(device), labels.to(device)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return losses


def collate(
    examples: Sequence[tuple[list[int], list[int]]], pad_id: int, max_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (B, L) ids, attention mask and labels (-100 where there is no loss)."""
    length = min(max_len, max(len(ids) for ids, _ in examples))
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (tokens, mask) in enumerate(examples):
        tokens, mask = tokens[:length], mask[:length]
        n = len(tokens)
        row = torch.tensor(tokens, dtype=torch.long)
        ids[i, :n] = row
        attn[i, :n] = 1
        keep = torch.tensor(mask, dtype=torch.bool)
        labels[i, :n] = torch.where(keep, row, torch.full_like(row, -100))
    return ids, attn, labels


def save_weights(model: Any, tokenizer: Any, folder: Path) -> None:  # noqa: ANN401
    """Save an HF checkpoint atomically: written aside, then renamed into place.

    Two runs of a sweep may finish the same SFT at once; the second finds the folder there and
    drops its own copy (both hold the same weights).
    """
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
