"""``engine.rl.grad_cos`` on verl: verl's own actor measures what the local engine measures.

The same batch (the tiny backbone's weights, token ids, response masks, advantages and old
log-probs) goes to the local engine's ``update.grad_conflict`` in this process and to verl's
actor in a fresh one (:func:`verl_side`): verl 0.9.1's ``ActorRolloutRefWorker`` with its FSDP2
engine on the ``cpu`` platform, one gloo rank, no Ray, built by its own ``init_model`` as
slca-exp's trainer asks for it (``GradCosActorWorker``). The actor splits the batch itself,
from its response mask and the reward side's ``slca/no_summary`` flags, and runs verl's
engine over micro-batches of 2 rollouts; the local engine takes the whole batch at once.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = pytest.mark.verl

import torch  # noqa: E402

from slca_exp.config.schema import RLConfig  # noqa: E402
from slca_exp.core import names  # noqa: E402
from slca_exp.engines.local.policy import response_logprobs  # noqa: E402
from slca_exp.engines.local.rollout import PackedBatch, pack  # noqa: E402
from slca_exp.engines.local.update import grad_conflict  # noqa: E402
from slca_exp.engines.verl import cpu  # noqa: E402
from slca_exp.engines.verl.keys import GRAD_COS_KEY  # noqa: E402
from slca_exp.engines.verl.rewards import NO_SUMMARY_KEY  # noqa: E402
from slca_exp.estimators import (  # noqa: E402
    EstimatorParams,
    RolloutScores,
    SegmentAdvantages,
    get_estimator,
)
from slca_exp.estimators.segments import split_segments  # noqa: E402
from tests.engines.tiny_world import build_world  # noqa: E402

TEMPERATURE = 0.9
MICRO = 2
"""Rollouts per forward-backward pass in verl's engine (the local engine: the whole batch)."""
COS_ATOL = 1e-7
"""|cos_verl - cos_local|. Both take float32 gradients of the same loss from the same weights and
sum them in float64; verl accumulates four micro-batches' gradients over unpadded sequences
where the local engine runs the batch at once, left-padded, so the float32 gradients differ in
their last bits. Measured: at most 9.4e-10 (the cosines are about -0.005 here)."""
NORMS = (names.TRAIN_GRAD_NORM_TOOL, names.TRAIN_GRAD_NORM_SUMMARY)
NORM_RTOL = 1e-5
"""Relative difference of each gradient norm, for the same reason. Measured: at most 9.5e-8."""

MASKS = [
    [1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1],
    [1, 1, 1, 1, 1, 1, 1],
    [1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1],
    [1, 1, 0, 0, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    [1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    [1, 1, 1, 0, 0, 1, 1, 1],
]
"""Eight responses (1: generated, 0: a tool response), two groups of four: tool calls and a
summary, a summary alone (rows 1 and 5)."""
CASES = {
    "parity": (MASKS, [False] * 8),
    "corrected": (MASKS, [True, False, False, True, False, False, False, False]),
    "no tool": ([[1] * len(m) for m in MASKS], [False] * 8),
    "no summary": (MASKS, [True] * 8),
    "no advantage": (MASKS, [False] * 8),
}
"""Name -> (response masks, the rollouts the reward side flags as having no summary); the
``no advantage`` case has every advantage 0."""


def batch(world, case: str) -> tuple[PackedBatch, torch.Tensor, SegmentAdvantages, list[bool]]:
    """The case's rollouts: packed, old log-probs, slca_grpo advantages (and segments), flags.

    The old log-probs are the policy's, moved by about 0.3 nats, so that PPO's clip takes part.
    """
    masks, flags = CASES[case]
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 290, (4 + i % 5,), generator=g).tolist() for i in range(8)]
    responses = [torch.randint(5, 290, (len(m),), generator=g).tolist() for m in masks]
    packed = pack(prompts, responses, masks, 0)
    split = split_segments(packed.response_mask).without_summary(torch.tensor(flags))
    scores = RolloutScores(*torch.rand(3, 8, generator=g))
    adv = get_estimator("slca_grpo")(split, [0] * 4 + [1] * 4, scores, EstimatorParams())
    if case == "no advantage":
        adv.advantages.zero_()
    with torch.no_grad():
        old = response_logprobs(world.backbone.model, packed, TEMPERATURE)[0]
    old = old + 0.3 * torch.randn(old.shape, generator=g)
    return packed, old, adv, flags


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory)


@pytest.fixture(scope="module")
def local(world) -> dict[str, dict[str, float]]:
    """The local engine's ``update.grad_conflict`` of each case."""
    out = {}
    for case in CASES:
        packed, old, adv, _ = batch(world, case)
        out[case] = grad_conflict(
            world.backbone.model, packed, old, adv.advantages, adv, RLConfig(), TEMPERATURE
        )
    return out


def verl_rows(world, case: str) -> list[dict]:
    """The case as verl's agent loop leaves it in the TransferQueue: one dict a rollout."""
    packed, old, adv, flags = batch(world, case)
    p, rows = packed.prompt_len, []
    for i, flag in enumerate(flags):
        real = packed.attention_mask[i].bool()
        prompt = packed.input_ids[i, :p][real[:p]]
        n = int(real[p:].sum())
        ids = torch.cat([prompt, packed.input_ids[i, p : p + n]])
        mask = packed.response_mask[i, :n].long()
        rows.append(
            {
                "prompts": prompt,
                "responses": packed.input_ids[i, p : p + n],
                "response_mask": mask,
                "loss_mask": mask,
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "position_ids": torch.arange(len(ids)),
                "old_log_probs": old[i, :n].float(),
                "advantages": adv.advantages[i, :n].float(),
                "extra_fields": {"reward_extra_info": {NO_SUMMARY_KEY: int(flag)}},
            }
        )
    return rows


@pytest.fixture(scope="module")
def measured(world, tmp_path_factory) -> dict:
    """What verl's actor measured for each case, and what its update returned (``verl_side``)."""
    folder = tmp_path_factory.mktemp("grad-cos")
    request = folder / "request.pt"
    rows = {case: verl_rows(world, case) for case in CASES}
    torch.save({"model": str(world.backbone.path), "cases": rows}, request)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        **cpu.WORKER_ENV,
        **cpu.thread_env(),
        "WORLD_SIZE": "1",
        "RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    env.pop("VERL_USE_EXTERNAL_MODULES", None)
    start = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-c", VERL_SIDE, str(request), str(folder / "answer.json")],
        cwd=Path(__file__).resolve().parents[3],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    print(f"\nverl's actor: {time.monotonic() - start:.1f} s, start-up included")
    return json.loads((folder / "answer.json").read_text())


def ours(values: dict[str, float]) -> dict[str, float]:
    """The actor's keys under our names (what the trainer logs)."""
    from slca_exp.engines.verl.grad_cos import ACTOR_KEYS

    return {ACTOR_KEYS[k]: v for k, v in values.items()}


@pytest.mark.parametrize("case", ["parity", "corrected"])
def test_verls_actor_measures_the_local_engines_cosine_and_norms(local, measured, case):
    """The same cosine and norms on both engines, up to float32 noise (:data:`COS_ATOL`).

    Under ``corrected`` the two rollouts flagged as cut off on a tool call are all tool: the
    actor matches only if it read the reward side's flags, as the estimator split them.
    """
    ours_, verl = local[case], ours(measured["cases"][case])
    print(f"{case}: local {ours_}\n{case}: verl  {verl}")
    assert abs(verl[names.TRAIN_GRAD_COS] - ours_[names.TRAIN_GRAD_COS]) <= COS_ATOL
    for key in NORMS:
        assert ours_[key] > 0 and verl[key] == pytest.approx(ours_[key], rel=NORM_RTOL)


@pytest.mark.parametrize(
    ("case", "absent"),
    [("no tool", names.TRAIN_GRAD_NORM_TOOL), ("no summary", names.TRAIN_GRAD_NORM_SUMMARY)],
)
def test_an_absent_segment_gives_a_nan_cosine_and_a_zero_norm_on_both_engines(
    local, measured, case, absent
):
    ours_, verl = local[case], ours(measured["cases"][case])
    present = (set(NORMS) - {absent}).pop()
    for values in (ours_, verl):
        assert math.isnan(values[names.TRAIN_GRAD_COS]) and values[absent] == 0.0
    assert verl[present] == pytest.approx(ours_[present], rel=NORM_RTOL) and ours_[present] > 0


def test_segments_without_an_advantage_give_zero_gradients_and_a_zero_cosine(local, measured):
    zero = dict.fromkeys((names.TRAIN_GRAD_COS, *NORMS), 0.0)
    assert local["no advantage"] == zero == ours(measured["cases"]["no advantage"])


def test_verls_update_returns_the_measurement_beside_its_own_metrics(measured):
    """``train_mini_batch`` (what ``update_actor`` calls) measures, then updates as verl does."""
    update = measured["update"]
    assert update["grad_norm"] and all(math.isfinite(v) for v in update["grad_norm"])
    for key, value in measured["cases"]["parity"].items():
        assert update[key] == [value]  # the weights the update started from: the same values
    assert measured["zeroed"]  # the diagnostic leaves no gradient behind for the update


def test_the_trainer_logs_the_actors_values_under_our_names():
    from slca_exp.engines.verl.grad_cos import our_metrics

    metrics = {
        "actor/slca_grad_cos": 0.25,
        "actor/slca_grad_norm_tool": 2.0,
        "actor/slca_grad_norm_summary": 3.0,
        "actor/grad_norm": 1.0,
    }
    assert our_metrics(metrics) == {
        names.TRAIN_GRAD_COS: 0.25,
        names.TRAIN_GRAD_NORM_TOOL: 2.0,
        names.TRAIN_GRAD_NORM_SUMMARY: 3.0,
    }
    assert metrics == {"actor/grad_norm": 1.0}


def test_the_verl_internals_the_diagnostic_leans_on_are_still_there():
    from slca_exp.engines.verl.grad_cos import check_internals

    assert check_internals() == []


def test_engine_rl_grad_cos_reaches_verls_trainer_and_stays_off_by_default():
    from slca_exp.engines.verl.grad_cos import enabled
    from slca_exp.engines.verl.rl_config import SOURCES, verl_config
    from slca_exp.preflight.compose import compose_run
    from slca_exp.preflight.validate import validate

    def translated(*overrides):
        return verl_config(validate(compose_run(["experiment=paper_7b", *overrides])))

    assert enabled(translated("engine.rl.grad_cos=true"))
    assert not enabled(translated())
    assert SOURCES[GRAD_COS_KEY] == "engine.rl.grad_cos"  # a problem on it names our key


VERL_SIDE = (
    "import sys\n"
    "import slca_exp.engines.verl.cpu.platform\n"  # before anything asks verl for its platform
    "from pathlib import Path\n"
    "from tests.engines.verl.test_grad_cosine_on_cpu import verl_side\n"
    "verl_side(Path(sys.argv[1]), Path(sys.argv[2]))\n"
)


def verl_side(request: Path, answer: Path) -> None:
    """Build verl's actor as slca-exp's trainer asks for it; measure each case; update once."""
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    from omegaconf import OmegaConf, open_dict
    from verl.utils import tensordict_utils as tu
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from slca_exp.engines.verl.compose import compose_verl, verl_config_dir
    from slca_exp.engines.verl.grad_cos import GradCosActorWorker

    asked = torch.load(request, weights_only=False)
    cfg = compose_verl(str(verl_config_dir()), "ppo_trainer").copy()
    values = {**cpu.verl_values(False, cpu.HF_ROLLOUT), **cpu.new_values(False, 1)}
    actor = "actor_rollout_ref.actor."
    values |= {
        "actor_rollout_ref.model.path": asked["model"],
        actor + "strategy": "fsdp2",
        actor + "ppo_mini_batch_size": 8,
        actor + "ppo_micro_batch_size_per_gpu": MICRO,
        actor + "use_kl_loss": False,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": MICRO,
        "actor_rollout_ref.rollout.n": 1,
    }
    with open_dict(cfg):
        for key, value in values.items():
            OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    OmegaConf.resolve(cfg)
    worker = GradCosActorWorker(config=cfg.actor_rollout_ref, role="actor")
    worker.init_model()

    def data(case: str):
        td = list_of_dict_to_tensordict(asked["cases"][case])
        extra = {"temperature": TEMPERATURE, "global_batch_size": 8, "mini_batch_size": 8}
        tu.assign_non_tensor(td, **extra, epochs=1, seed=0, calculate_entropy=False)
        return td

    cases = {case: worker.actor.grad_conflict(data(case)) for case in asked["cases"]}
    zeroed = all(p.grad is None for p in worker.actor.engine.module.parameters())
    update = tu.get(worker.actor.train_mini_batch(data("parity")), "metrics")
    update = {k: [float(x) for x in v] for k, v in update.items() if isinstance(v, list)}
    answer.write_text(json.dumps({"cases": cases, "update": update, "zeroed": zeroed}))
    torch.distributed.destroy_process_group()
