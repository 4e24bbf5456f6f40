"""The RL update pushes a reward the tiny policy can learn up, through the engine's own pieces.

Rollouts come from the real Roller on synthetic rows, advantages from the registered estimator,
the update from ``rl_update``. The reward is one a randomly initialised policy can learn in a few
dozen steps: the share of the final reply's tokens drawn from the lower half of the vocabulary.
With the sign of the scores flipped the same loop must push it down: that pins the sign of the
update and that the summary advantage reaches the summary tokens.
"""

import pytest
import torch

from slca_exp.backbones import load_backbone
from slca_exp.backbones.chat import render_prompt, render_text, tool_turn_text
from slca_exp.config.schema import BackboneConfig, RLConfig
from slca_exp.config.services import SimulatorConfig
from slca_exp.core.rows import Row
from slca_exp.data.splits import load_split
from slca_exp.data.synthetic import generate
from slca_exp.engines.local.rollout import Roller, RolloutSettings
from slca_exp.engines.local.update import rl_update
from slca_exp.estimators import EstimatorParams, RolloutScores, get_estimator
from slca_exp.simulators import build_simulator
from tests.engines.tiny_world import TINY_ARCH


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("signal")
    files = generate(root / "data", rows=16, seed=0)
    rows = load_split(files["train"], "train").rows
    texts = [render_text(list(r["prompt"]), Row(r).tools()) for r in rows]
    cfg = BackboneConfig(name="tiny", source="builtin", arch=TINY_ARCH)
    return cfg, rows, texts, root


def _train(setup, sign):
    cfg, rows, texts, root = setup
    backbone = load_backbone(cfg, corpus=lambda: texts, cache_root=root / "cache", seed=0)
    model, tok = backbone.model, backbone.tokenizer
    roller = Roller(model, tok, build_simulator(SimulatorConfig()), render_prompt, tool_turn_text)
    half = len(tok) // 2
    settings = RolloutSettings(max_turns=0, max_turn_tokens=16, max_response_tokens=16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    estimator, params = get_estimator("slca_grpo"), EstimatorParams()
    rl = RLConfig(steps=30, lr=3e-3)
    curve = []
    torch.manual_seed(0)
    for step in range(30):
        rolls = roller.run(rows[(step * 4) % 16 : (step * 4) % 16 + 4], 8, settings)
        low = torch.tensor([sum(t < half for t in r) / max(len(r), 1) for r in rolls.response_ids])
        curve.append(float(low.mean()))
        scores = RolloutScores(tool=torch.rand(len(low)), summary=sign * low, total=sign * low)
        packed = rolls.batch(roller.pad_id)
        adv = estimator(packed.response_mask, rolls.group, scores, params)
        model.train()
        rl_update(model, None, optimizer, packed, adv, rl, temperature=1.0)
        model.eval()
    return curve


def test_the_learnable_reward_rises_and_falls_with_the_sign_of_the_scores(setup):
    up = _train(setup, +1.0)
    down = _train(setup, -1.0)
    start_up, end_up = sum(up[:5]) / 5, sum(up[-5:]) / 5
    start_down, end_down = sum(down[:5]) / 5, sum(down[-5:]) / 5
    assert end_up > start_up + 0.1, up
    assert end_down < start_down - 0.1, down
