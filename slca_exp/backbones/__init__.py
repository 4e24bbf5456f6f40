"""Backbones: the policy model and tokenizer the local engine trains (recorded component 1 of 5).

``load_backbone`` builds the tiny builtin model (``backbone=tiny``) or loads pretrained weights
that are already on this machine (``backbone=qwen2.5-7b-instruct``, ...); ``chat`` holds the chat
layout shared by the template, multi-turn rollouts and SFT. Importing this package is cheap:
torch and transformers are imported when a backbone is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from slca_exp.backbones.base import Backbone, BackboneError
from slca_exp.backbones.chat import (
    TEMPLATE,
    TEMPLATE_SHA256,
    check_template,
    render_prompt,
    render_trajectory,
    tokenize_trajectory,
    tool_turn_text,
)

__all__ = [
    "TEMPLATE",
    "TEMPLATE_SHA256",
    "Backbone",
    "BackboneError",
    "check_template",
    "load_backbone",
    "render_prompt",
    "render_trajectory",
    "tokenize_trajectory",
    "tool_turn_text",
]


def load_backbone(
    cfg: Any,  # noqa: ANN401 - BackboneConfig or its DictConfig
    *,
    corpus: Callable[[], Iterable[str]] | None,
    cache_root: Path,
    seed: int,
    device: str = "cpu",
) -> Backbone:
    """The backbone ``cfg`` describes, ready for the engine (eval mode, on ``device``).

    Args:
        cfg: ``backbone`` of the run config.
        corpus: returns the texts the builtin tokenizer is trained on (rendered SFT trajectories
            and RL prompts); unused for ``hf`` / ``local``.
        cache_root: builtin checkpoints are saved under ``cache_root / "backbones"``.
        seed: initialises the builtin model's weights (the same inputs give the same weights).
        device: torch device string.

    Raises:
        BackboneError: (a ``ValueError``) the backbone cannot be built or its weights are not on
            this machine; the message names the key and the fix.

    """
    if cfg.source == "builtin":
        from slca_exp.backbones.tiny import build_tiny

        return build_tiny(cfg, corpus=corpus, cache_root=cache_root, seed=seed, device=device)
    if cfg.source in ("hf", "local"):
        from slca_exp.backbones.hf import load_pretrained

        return load_pretrained(cfg, device=device)
    raise BackboneError(f"backbone.source={cfg.source!r} is not one of builtin, hf, local")
