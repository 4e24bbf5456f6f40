"""Stage 1: supervised fine-tuning on the gold trajectories of the SFT split.

Teacher forcing over the whole rendered trajectory, with the loss (token-mean cross-entropy) on the
assistant's own tokens only: tool calls, the final reply and their end-of-turn tokens. System,
user and tool-response tokens are context, as in the paper's LLaMA-Factory warm start.

A trajectory cut by ``engine.sft.max_len`` before its first assistant token has nothing to learn
from; a batch made only of such trajectories has no label (its cross-entropy would be 0 / 0, a
NaN that one optimizer step spreads over every weight). Such a batch is skipped, counted, and the
next one drawn, so ``engine.sft.steps`` optimizer steps are still taken.

The result is cached by what determines it (backbone checkpoint, SFT split hash, SFT settings,
seed), so every run of a sweep over rewards or estimators starts from the same SFT weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from slca_exp.config.schema import SFTConfig

LOOP_VERSION = 2
"""Part of the cache key; raised when the training loop changes what the same inputs give.

2: batches without a label are skipped (version 1 stepped on their NaN loss).
"""


def sft_key(backbone_path: Path, split_sha256: str, cfg: SFTConfig, seed: int) -> str:
    """The cache key of an SFT result (hex, 16 characters)."""
    blob = json.dumps(
        {
            "loop": LOOP_VERSION,
            "backbone": str(backbone_path),
            "split": split_sha256,
            "sft": {k: getattr(cfg, k) for k in ("steps", "batch_size", "lr", "max_len")},
            "seed": seed,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


IGNORE = -100
"""Label of a token without loss (``torch.nn.functional.cross_entropy``'s ``ignore_index``)."""


def train_sft(
    model: torch.nn.Module,
    examples: Sequence[tuple[list[int], list[int]]],
    cfg: SFTConfig,
    *,
    seed: int,
    pad_id: int,
    on_step: Callable[[int, float], None] | None = None,
    on_skip: Callable[[int, int], None] | None = None,
) -> list[float]:
    """Fine-tune ``model`` in place on ``(input_ids, loss_mask)`` examples.

    Args:
        model: the causal LM.
        examples: tokenised trajectories and their loss masks (1 on assistant tokens).
        cfg: ``engine.sft``.
        seed: shuffling seed.
        pad_id: padding token id.
        on_step: called with (step, loss) after every optimizer step.
        on_skip: called with (step, batches skipped so far) for every batch skipped for having
            no label; ``step`` is the optimizer step it was drawn for.

    Returns:
        The loss of every step.

    Raises:
        ValueError: no examples, or none with an assistant token within ``cfg.max_len``.

    """
    if not examples:
        raise ValueError("the SFT split has no trajectories; set engine.sft.enabled=false")
    if not any(any(mask[1 : cfg.max_len]) for _, mask in examples):
        raise ValueError(
            f"no SFT trajectory has an assistant token within its first engine.sft.max_len="
            f"{cfg.max_len} tokens (the prompt and tool schemas fill them); raise "
            "engine.sft.max_len, or set engine.sft.enabled=false"
        )
    device = next(model.parameters()).device
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(1, cfg.steps // 10))
    )
    order: list[int] = []
    losses: list[float] = []
    skipped = 0
    model.train()
    while len(losses) < cfg.steps:
        step = len(losses)
        if len(order) < cfg.batch_size:
            order += rng.sample(range(len(examples)), len(examples))
        picked, order = order[: cfg.batch_size], order[cfg.batch_size :]
        ids, attn, labels = collate([examples[i] for i in picked], pad_id, cfg.max_len)
        targets = labels[:, 1:]
        # At least one labelled example exists (checked above) and every pass over ``order``
        # draws it, so this ends.
        if not bool((targets != IGNORE).any()):
            skipped += 1
            if on_skip is not None:
                on_skip(step, skipped)
            continue
        ids, attn, targets = ids.to(device), attn.to(device), targets.to(device)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    if skipped:
        print(
            f"slca-exp: SFT skipped {skipped} batch{'es' if skipped != 1 else ''} with no "
            f"assistant token within engine.sft.max_len={cfg.max_len}",
            file=sys.stderr,
        )
    return losses


def collate(
    examples: Sequence[tuple[list[int], list[int]]], pad_id: int, max_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (B, L) ids, attention mask and labels (``IGNORE`` where there is no loss)."""
    length = min(max_len, max(len(ids) for ids, _ in examples))
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, IGNORE)
    for i, (tokens, mask) in enumerate(examples):
        tokens, mask = tokens[:length], mask[:length]
        n = len(tokens)
        row = torch.tensor(tokens, dtype=torch.long)
        ids[i, :n] = row
        attn[i, :n] = 1
        keep = torch.tensor(mask, dtype=torch.bool)
        labels[i, :n] = torch.where(keep, row, torch.full_like(row, IGNORE))
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
