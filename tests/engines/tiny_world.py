"""A tiny built-in backbone, synthetic rows and real rollouts for the local engine's tests.

The backbone is built once per test session (its checkpoint is cached under the session's
temporary folder, so every module that asks again loads it from there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from slca_exp.backbones import Backbone, load_backbone
from slca_exp.backbones.chat import render_prompt, render_text, tool_turn_text
from slca_exp.config.schema import BackboneConfig, TinyArchConfig
from slca_exp.config.services import SimulatorConfig
from slca_exp.core.rows import Row
from slca_exp.data.splits import load_split
from slca_exp.data.synthetic import generate
from slca_exp.engines.local.rollout import PackedBatch, Roller, RolloutSettings
from slca_exp.estimators import EstimatorParams, RolloutScores, SegmentAdvantages, get_estimator
from slca_exp.simulators import build_simulator

TINY_ARCH = TinyArchConfig(
    num_layers=1,
    hidden_size=32,
    num_heads=2,
    intermediate_size=64,
    vocab_size=300,
    max_position_embeddings=1024,
)
"""The tests' tiny built-in architecture: one layer, fast enough to train in a test."""


@dataclass
class World:
    """What the tests draw on: the backbone, the RL prompts and the SFT trajectories."""

    backbone: Backbone
    rows: list[dict[str, Any]]
    sft: list[dict[str, Any]]

    @property
    def roller(self) -> Roller:
        """A roller over the backbone's policy and the replay simulator."""
        bb = self.backbone
        simulator = build_simulator(SimulatorConfig())
        return Roller(bb.model, bb.tokenizer, simulator, render_prompt, tool_turn_text)

    def rollouts(
        self, prompts: int, group: int, *, seed: int = 0
    ) -> tuple[PackedBatch, SegmentAdvantages]:
        """``prompts x group`` real rollouts, packed, with slca_grpo advantages of random scores."""
        roller = self.roller
        torch.manual_seed(seed)
        rolls = roller.run(self.rows[:prompts], group, RolloutSettings(1, 16, 48))
        packed = rolls.batch(roller.pad_id)
        n = len(rolls)
        scores = RolloutScores(tool=torch.rand(n), summary=torch.rand(n), total=torch.rand(n))
        adv = get_estimator("slca_grpo")(
            packed.response_mask, rolls.group, scores, EstimatorParams()
        )
        return packed, adv


def build_world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """The session's world (built on first use, then loaded from its cache)."""
    root = tmp_path_factory.getbasetemp() / "tiny-world"
    files = generate(root / "data", rows=16, seed=0)
    rows = load_split(files["train"], "train").rows
    sft = load_split(files["sft"], "sft").rows
    texts = [render_text(list(r["prompt"]), Row(r).tools()) for r in rows]
    texts += [render_text(json.loads(r["messages"]), Row(r).tools()) for r in sft]
    backbone = load_backbone(
        BackboneConfig(name="tiny", source="builtin", arch=TINY_ARCH),
        corpus=lambda: texts,
        cache_root=Path(root) / "cache",
        seed=0,
    )
    return World(backbone, rows, sft)
