"""Every estimator sees the same scores through verl as in the local engine: grpo too.

One batch of real rollouts (the shared fixture): the tiny tool caller (the built-in backbone
after a short SFT, ``tests/engines/tool_caller.py``) on the synthetic split, through the local
engine's Roller, 6 prompts x 6 rollouts, one calling turn allowed, scored per run config with
HierR, the rubric judge and penalty routing.

The local engine's side: the registered estimator on the packed batch and the routed scores.
verl's side: each rollout as verl leaves it in the TransferQueue: our reward manager's result
for that rollout, ``rm_scores`` from the agent loop the translated config picks for the estimator
(ours for ours, verl's own for ``grpo``), then slca-exp's trainer around verl's own v1 advantage
step (``_compute_advantage``, the TransferQueue an in-memory store as in
``test_trainer_on_cpu.py``). Under the corrected mask rule the local side gets the no-summary
flags the way the trainer hands them over (the reward side reads them off the text).
"""

import asyncio

import numpy as np
import pytest
import torch

from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = pytest.mark.verl

import transfer_queue  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput  # noqa: E402

from slca_exp.backbones.hf import load_folder  # noqa: E402
from slca_exp.core import names  # noqa: E402
from slca_exp.engines.local.rollout import RolloutSettings  # noqa: E402
from slca_exp.engines.verl import plugin  # noqa: E402, F401 - registers the trainer
from slca_exp.engines.verl.agent_loop import AGENT_NAME, as_segment_scored  # noqa: E402
from slca_exp.engines.verl.keys import OUR_KEY  # noqa: E402
from slca_exp.engines.verl.rewards import SLCARewardManager  # noqa: E402
from slca_exp.engines.verl.rl_config import agent_loop, estimator_params, our_section  # noqa: E402
from slca_exp.engines.verl.trainer import SLCATrainer  # noqa: E402
from slca_exp.estimators import EstimatorParams, get_estimator  # noqa: E402
from slca_exp.estimators.segments import split_segments  # noqa: E402
from slca_exp.judges import build_judge  # noqa: E402
from slca_exp.preflight.compose import compose_run  # noqa: E402
from slca_exp.preflight.validate import validate  # noqa: E402
from slca_exp.rewards import HierRReward  # noqa: E402
from slca_exp.rewards.toolcalls import ends_on_tool_call  # noqa: E402
from tests.engines.tool_caller import roller_for  # noqa: E402
from tests.engines.verl.test_trainer_on_cpu import MemoryQueue  # noqa: E402

ESTIMATORS = ("grpo", "toolpo_grpo", "slca_grpo")
GROUP = 6  # rollouts per prompt
WEIGHTS = (1.0, 0.5)  # reward.process_weight


@pytest.fixture(scope="module")
def rollouts(tool_caller):
    """36 real rollouts of the tool caller, its tokenizer and the packed response mask.

    Three prompts need no call and three do: the batch holds replies without a call (one
    learnable run, scored on both segments), calls answered by the simulator, and rollouts cut
    off on a call.
    """
    backbone = load_folder(tool_caller.folder, name="tool-caller", dtype="float32")
    roller = roller_for(backbone)
    no_call = [r for r in tool_caller.rows if not needs_call(r)][:3]
    calls = [r for r in tool_caller.rows if needs_call(r)][:3]
    torch.manual_seed(0)
    rolls = roller.run(no_call + calls, GROUP, RolloutSettings(1, 48, 160))
    return rolls, backbone.tokenizer, rolls.batch(roller.pad_id).response_mask


def needs_call(row):
    return row["reward_model"]["ground_truth"]["subset_name"] != "irrelevant"


def run_config(process_weight, estimator="slca_grpo"):
    return validate(
        compose_run([f"reward.process_weight={process_weight}", f"algorithm={estimator}"])
    )


@pytest.fixture(scope="module")
def scored(rollouts):
    """Per process weight: the local engine's reward batch, and our reward manager's results."""
    rolls, tok, _ = rollouts
    truths = [row["reward_model"]["ground_truth"] for row in rolls.rows]
    out = {}
    for weight in WEIGHTS:
        config = run_config(weight)
        judge = build_judge(config.judge)
        local = HierRReward.from_config(config.reward).score(rolls.texts, truths, judge)
        judge.close()
        results = {}
        for rule in ("parity", "corrected"):
            verl_config = {OUR_KEY: our_section(config), "algorithm": {"slca": {"mask_rule": rule}}}
            manager = SLCARewardManager(OmegaConf.create(verl_config), tok)
            results[rule] = [manager_result(manager, rolls, i) for i in range(len(rolls))]
        out[weight] = (local, results)
    return out


def manager_result(manager, rolls, i):
    """What our reward manager returns for rollout ``i`` (verl's reward loop hands it one)."""
    prompt = torch.tensor([rolls.prompt_ids[i]])
    response = torch.tensor([rolls.response_ids[i]])
    data = DataProto.from_dict(
        tensors={
            "prompts": prompt,
            "responses": response,
            "attention_mask": torch.ones(1, prompt.shape[1] + response.shape[1]),
        },
        non_tensors={"reward_model": np.array([rolls.rows[i]["reward_model"]], dtype=object)},
    )
    return asyncio.run(manager.run_single(data))


def verl_rows(rolls, results, estimator):
    """The TransferQueue as verl's agent loop fills it, and the batch's keys."""
    queue, keys = MemoryQueue(), []
    segmented = agent_loop(estimator) == AGENT_NAME
    for i, result in enumerate(results):
        output = AgentLoopOutput(
            prompt_ids=rolls.prompt_ids[i],
            response_ids=rolls.response_ids[i],
            response_mask=rolls.response_mask[i],
            reward_score=result["reward_score"],
            metrics=AgentLoopMetrics(),
            num_turns=2 * rolls.turns[i],
        )
        if segmented:
            output = as_segment_scored(output)
        output.extra_fields["reward_extra_info"] = result["reward_extra_info"]
        row = output.as_dict()
        key = f"prompt{rolls.group[i]}_{i}_0"  # {uid}_{session}_{index}
        queue.rows[("train", key)] = {
            "uid": f"prompt{rolls.group[i]}",
            "response_mask": row["response_mask"],
            "rm_scores": row["rm_scores"],
            "extra_fields": row["extra_fields"],
        }
        keys.append(key)
    tags = [{"status": "success"} for _ in keys]
    return queue, KVBatchMeta(keys=keys, tags=tags, partition_id="train")


def trainer(config, estimator, rule, group):
    """slca-exp's trainer with the algorithm section the translated config has."""
    algorithm = {
        "adv_estimator": estimator,
        "use_kl_in_reward": False,
        "gamma": 1.0,
        "lam": 1.0,
        "norm_adv_by_std_in_grpo": config.algorithm.norm_by_std,
        "slca": {**estimator_params(config), "mask_rule": rule},
    }
    instance = SLCATrainer.__new__(SLCATrainer)
    instance.config = OmegaConf.create(
        {"algorithm": algorithm, "actor_rollout_ref": {"rollout": {"n": group}}}
    )
    instance.global_steps = 1  # what verl's fit() sets before the first step
    return instance


def through_verl(monkeypatch, rolls, results, config, estimator, rule, width):
    queue, batch = verl_rows(rolls, results, estimator)
    monkeypatch.setattr(transfer_queue, "kv_batch_get", queue.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", queue.kv_batch_put)
    metrics = {}
    trainer(config, estimator, rule, GROUP)._compute_advantage(batch, metrics)
    rows = [queue.rows[("train", k)]["advantages"] for k in batch.keys]
    padded = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])
    return padded, metrics


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("rule", ["parity", "corrected"])
@pytest.mark.parametrize("weight", WEIGHTS)
def test_verl_computes_the_local_engines_advantages(
    monkeypatch, rollouts, scored, estimator, rule, weight
):
    rolls, _, mask = rollouts
    local_scores, results = scored[weight]
    config = run_config(weight, estimator)
    split = split_segments(mask)
    if rule == "corrected":  # what the trainer hands over: rollouts that end on a tool call
        split = split.without_summary(torch.tensor([ends_on_tool_call(t) for t in rolls.texts]))
    params = EstimatorParams.from_config(config.algorithm)
    local = get_estimator(estimator)(split, rolls.group, local_scores.scores, params)
    got, metrics = through_verl(
        monkeypatch, rolls, results[rule], config, estimator, rule, mask.shape[1]
    )
    if estimator == "grpo":  # verl's own float32 loop against our float64 statistics
        torch.testing.assert_close(got, local.advantages, atol=1e-5, rtol=0)
    else:
        assert torch.equal(got, local.advantages)
    for key, value in local.stats.items():  # our per-segment metrics, logged for every estimator
        assert metrics[key] == pytest.approx(value, abs=1e-5), key
    assert set(names.adv(s, "mean") for s in names.SEGMENTS) <= set(metrics)
    for key in ("reward/tool/mean", "reward/summary/mean", "reward/total/mean"):
        assert metrics[key] == pytest.approx(local_scores.stats[key]), key


def test_the_batch_has_what_the_baselines_got_wrong(rollouts, scored):
    """Rollouts without a tool segment but with a tool score, and weighted totals."""
    rolls, _, mask = rollouts
    split = split_segments(mask)
    one_run = ~split.has_tool & split.has_summary
    local = scored[0.5][0].scores
    assert bool((one_run & (local.tool != 0)).any())  # R_tool counts in their GRPO total
    assert bool(split.has_tool.any()) and bool(one_run.any())
    assert not torch.allclose(local.total, local.tool + local.summary)  # process_weight 0.5
    flags = [ends_on_tool_call(t) for t in rolls.texts]
    assert 0 < sum(flags) < len(flags)  # the corrected rule changes something
    assert torch.isfinite(local.total).all()  # the rubric judge scored every summary
