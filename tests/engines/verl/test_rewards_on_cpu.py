"""Both scores at the right tokens: the reward manager and the agent-loop output, on real
multi-turn text (gold trajectories of the synthetic split, rendered with the Qwen-style
chat template and tokenized as a rollout is: tool responses and chat glue under mask 0)."""

import asyncio
import json
import math

import numpy as np
import pytest
import torch

from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = pytest.mark.verl

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput  # noqa: E402
from verl.trainer.ppo.metric_utils import process_validation_metrics  # noqa: E402

from slca_exp.backbones.chat import render_text, tokenize_trajectory  # noqa: E402
from slca_exp.backbones.tiny import train_tokenizer  # noqa: E402
from slca_exp.core import names  # noqa: E402
from slca_exp.data.rows import gold_messages  # noqa: E402
from slca_exp.data.synthetic import build_rows  # noqa: E402
from slca_exp.engines.verl.agent_loop import (  # noqa: E402
    SegmentScoredOutput,
    agent_loop_config,
    as_segment_scored,
)
from slca_exp.engines.verl.estimators import segment_scores  # noqa: E402
from slca_exp.engines.verl.keys import OUR_KEY  # noqa: E402
from slca_exp.engines.verl.reward_infos import validation_metrics  # noqa: E402
from slca_exp.engines.verl.rewards import (  # noqa: E402
    SUMMARY_FAILED_KEY,
    SUMMARY_KEY,
    TOOL_KEY,
    TOTAL_KEY,
    SLCARewardManager,
    place_segment_scores,
    success_key,
)
from slca_exp.engines.verl.rl_config import our_section  # noqa: E402
from slca_exp.preflight.compose import compose_run  # noqa: E402
from slca_exp.preflight.validate import validate  # noqa: E402
from slca_exp.rewards.judging import JudgeResult  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return build_rows(16, "train", seed=11)


@pytest.fixture(scope="module")
def tokenizer(rows):
    texts = [render_text(gold_messages(r), tools_of(r)) for r in rows]
    return train_tokenizer(texts, vocab_size=500, max_length=2048)


@pytest.fixture(scope="module")
def manager(tokenizer):
    config = validate(compose_run([]))
    return SLCARewardManager(OmegaConf.create({OUR_KEY: our_section(config)}), tokenizer)


def tools_of(row):
    return json.loads(row["reward_model"]["ground_truth"]["tool_schemas"])


def rollout(tokenizer, row):
    """(prompt ids, response ids, response mask) of the row's gold trajectory."""
    ids, mask = tokenize_trajectory(tokenizer, gold_messages(row), tools_of(row))
    start = mask.index(1)  # the prompt ends with the generation prompt
    return ids[:start], ids[start:], mask[start:]


def runs(mask):
    out, start = [], None
    for t, v in enumerate([*mask, 0]):
        if v and start is None:
            start = t
        elif not v and start is not None:
            out.append((start, t - 1))
            start = None
    return out


def score(manager, prompt, response, row, extra=None):
    p, r = torch.tensor([prompt]), torch.tensor([response])
    data = DataProto.from_dict(
        tensors={
            "prompts": p,
            "responses": r,
            "attention_mask": torch.ones(1, p.shape[1] + r.shape[1]),
        },
        non_tensors={
            "reward_model": np.array([row["reward_model"]], dtype=object),
            **(extra or {}),
        },
    )
    return asyncio.run(manager.run_single(data))


def test_a_multi_step_rollout_gets_r_tool_and_r_sum_at_the_ends_of_its_segments(
    tokenizer, manager, rows
):
    row = next(
        r
        for r in rows
        if len(json.loads(r["reward_model"]["ground_truth"]["gold_tool_calls"])) >= 1
    )
    prompt, response, mask = rollout(tokenizer, row)
    result = score(manager, prompt, response, row)
    info = result["reward_extra_info"]
    assert info[TOOL_KEY] == pytest.approx(1.0)  # the gold calls: every component full
    assert info[SUMMARY_KEY] > 0.5 and info["slca/judge_status"] == "ok"
    output = as_segment_scored(
        AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=response,
            response_mask=mask,
            reward_score=result["reward_score"],
            metrics=AgentLoopMetrics(),
            num_turns=5,
        )  # fmt: skip
    )
    output.extra_fields["reward_extra_info"] = info  # what verl's worker adds after scoring
    rm = output.as_dict()["rm_scores"]
    turns = runs(mask)
    assert len(turns) >= 2 and rm.shape == (len(response),)
    placed = {int(i): float(rm[i]) for i in torch.nonzero(rm).flatten()}
    assert placed == pytest.approx({turns[-2][1]: info[TOOL_KEY], turns[-1][1]: info[SUMMARY_KEY]})
    # the estimator's side reads them back as masked sums over the segments
    back = segment_scores(rm[None], torch.tensor([mask]))
    assert float(back.tool[0]) == pytest.approx(info[TOOL_KEY])
    assert float(back.summary[0]) == pytest.approx(info[SUMMARY_KEY])


def test_the_reward_workers_judge_noise_is_seeded_by_the_run_and_keeps_the_raw_rating(
    tokenizer, manager, rows
):
    config = validate(compose_run(["judge.noise.kind=flip", "judge.noise.p=1.0", "seed=5"]))
    section = our_section(config)
    assert section["judge"]["noise"] == {"kind": "flip", "std": 1.0, "p": 1.0, "seed": 5}
    noisy = [SLCARewardManager(OmegaConf.create({OUR_KEY: section}), tokenizer) for _ in "ab"]
    changed = 0
    for row in rows:
        prompt, response, _ = rollout(tokenizer, row)
        plain = score(manager, prompt, response, row)["reward_extra_info"]
        first, again = (score(m, prompt, response, row)["reward_extra_info"] for m in noisy)
        assert first == again  # another worker, the same draws
        assert first["slca/judge/raw_rating"] == plain["slca/judge/rating"]
        assert plain["slca/judge/raw_rating"] == plain["slca/judge/rating"]  # no noise
        changed += first["slca/judge/rating"] != first["slca/judge/raw_rating"]
    assert changed > 0


def test_a_rollout_with_no_call_carries_only_its_summary(tokenizer, manager, rows):
    row = next(r for r in rows if r["reward_model"]["ground_truth"]["subset_name"] == "irrelevant")
    prompt, response, mask = rollout(tokenizer, row)
    result = score(manager, prompt, response, row)
    info = result["reward_extra_info"]
    rm = place_segment_scores(torch.tensor(mask), info[TOOL_KEY], info[SUMMARY_KEY])
    (turn,) = runs(mask)  # one assistant turn: the summary, no tool segment
    assert set(torch.nonzero(rm).flatten().tolist()) <= {turn[1]}
    assert float(rm[turn[1]]) == pytest.approx(info[SUMMARY_KEY])
    assert float(rm.sum()) == pytest.approx(info[SUMMARY_KEY])


def test_the_scores_are_placed_only_on_learnable_tokens_and_nan_becomes_zero():
    mask = torch.tensor([0, 1, 1, 0, 0, 1, 0, 1, 1, 0])
    rm = place_segment_scores(mask, 0.25, float("nan"))
    assert rm.tolist() == [0, 0, 0, 0, 0, 0.25, 0, 0, 0, 0]
    assert place_segment_scores(torch.zeros(4), 1.0, 1.0).tolist() == [0, 0, 0, 0]


def test_without_reward_info_the_output_is_verls(tokenizer):
    output = SegmentScoredOutput(
        prompt_ids=[1, 2], response_ids=[3, 4, 5], response_mask=[1, 0, 1],
        reward_score=0.5, metrics=AgentLoopMetrics(),
    )  # fmt: skip
    assert output.as_dict()["rm_scores"].tolist() == [0.0, 0.0, 0.5]


def test_the_agent_loop_config_names_our_loop(tmp_path):
    path = agent_loop_config(tmp_path / "agent_loops.yaml")
    (entry,) = OmegaConf.load(path)
    assert entry.name == "slca_tool_agent"
    assert entry._target_ == "slca_exp.engines.verl.agent_loop.SLCAToolAgentLoop"


def test_the_outcome_reward_through_verls_reward_manager(tokenizer, manager, rows):
    """reward=exec_outcome in the reward workers: R_tool the verdict, HierR logged beside it."""
    from slca_exp.engines.verl.reward_infos import absent_tool_rows, validation_metrics
    from slca_exp.engines.verl.rewards import OUTCOME_KEY, TOOL_FAILED_KEY, reward_metrics
    from slca_exp.engines.verl.rollouts import rewards_from_info

    config = validate(compose_run(["reward=exec_outcome"]))
    section = our_section(config)
    assert section["reward"]["tool_reward"] == "outcome"
    outcome = SLCARewardManager(OmegaConf.create({OUR_KEY: section}), tokenizer)
    paper = our_section(validate(compose_run(["reward=hierr_paper"])))  # its HierR variant
    manager = SLCARewardManager(OmegaConf.create({OUR_KEY: paper}), tokenizer)
    infos = []
    for row in rows:
        prompt, response, _ = rollout(tokenizer, row)
        plain = score(manager, prompt, response, row)["reward_extra_info"]
        extra = {"extra_info": np.array([row["extra_info"]], dtype=object)}
        got = score(outcome, prompt, response, row, extra)
        info = got["reward_extra_info"]
        # the gold trajectory solves its task: R_tool 1, HierR's score logged beside it
        assert (info[OUTCOME_KEY], info[TOOL_KEY], info[TOOL_FAILED_KEY]) == (1, 1.0, 0)
        assert info["slca/tool/hierr"] == plain["slca/tool/score"]
        assert info[SUMMARY_KEY] == plain[SUMMARY_KEY]
        assert got["reward_score"] == pytest.approx(1.0 + info[SUMMARY_KEY])
        record = rewards_from_info(info)
        assert (record.outcome, record.tool, record.hierr) == (
            "Solved",
            1.0,
            info["slca/tool/hierr"],
        )
        infos.append(info)
    # A tool row whose recorded answers are missing cannot be decided by the facts rule: absent
    row = next(r for r in rows if r["reward_model"]["ground_truth"]["subset_name"] != "irrelevant")
    prompt, response, _ = rollout(tokenizer, row)
    info = score(outcome, prompt, response, row)["reward_extra_info"]
    assert (info[OUTCOME_KEY], info[TOOL_FAILED_KEY], info[TOOL_KEY]) == (-1, 1, 0.0)
    assert info["slca/outcome/status"] == "failed"
    assert list(absent_tool_rows([*infos[:2], info])) == [False, False, True]
    record = rewards_from_info(info)
    assert record.outcome is None and math.isnan(record.routed_tool) and math.isnan(record.total)
    metrics = reward_metrics([*infos, info])
    assert metrics["outcome/failures"] == 1.0 and metrics["reward/outcome/solved_frac"] == 1.0
    assert metrics["reward/tool/mean"] == 1.0  # the absent one left out
    assert metrics["reward/tool/hierr/mean"] == pytest.approx(
        sum(i["slca/tool/hierr"] for i in [*infos, info]) / (len(infos) + 1)
    )
    # verl's validation logs the same val/* metrics as the local engine, success@k included
    every = [*infos, info]
    val = validation_metrics(every)
    assert val["val/reward/outcome/solved_frac"] == 1.0 and val["val/outcome/failures"] == 1.0
    hierr = [i["slca/tool/hierr"] for i in every]
    for k in (0.7, 0.8, 0.9, 1.0):
        assert val[f"val/tool_success@{k:g}" if k < 1 else "val/tool_success@1.0"] == sum(
            h >= k - 1e-9 for h in hierr
        ) / len(every)
    totals = [i[TOTAL_KEY] for i in infos]  # the absent one is no success
    assert val["val/success@0.9"] == sum(t / 2 >= 0.9 - 1e-9 for t in totals) / len(every)


class FailsEveryThird:
    """The recipe's judge, but every third request it is asked fails (an outage, never rated)."""

    def __init__(self, judge):
        self.judge, self.asked = judge, 0

    def score(self, batch):
        results = self.judge.score(batch)
        for i in range(len(results)):
            self.asked += 1
            if self.asked % 3 == 0:
                results[i] = JudgeResult.failed("outage")
        return results


def test_verls_mean_of_each_rollouts_success_flags_is_our_val_success_at_k(tokenizer, rows):
    """Each ``slca/success@k`` flag, meaned by verl's own validation code, is ``val/success@k``.

    The rollouts: each row's gold trajectory, and the next row's under this row's ground truth
    (wrong calls: low HierR scores); every third summary is absent (a judge failure, still a
    rollout that counts and never a success). ``reward.summary_weight=0.5`` normalises the
    totals by 1.5. Flags are 0/1, so both means are k/N, exactly.
    """
    config = validate(compose_run(["reward.summary_weight=0.5"]))
    manager = SLCARewardManager(OmegaConf.create({OUR_KEY: our_section(config)}), tokenizer)
    manager.judge = FailsEveryThird(manager.judge)
    infos = []
    for row, other in zip(rows, [*rows[1:], rows[0]], strict=True):
        for source in (row, other):
            prompt, response, _ = rollout(tokenizer, source)
            infos.append(score(manager, prompt, response, row)["reward_extra_info"])
    absent = [bool(i[SUMMARY_FAILED_KEY]) for i in infos]
    assert 0 < sum(absent) < len(infos)
    ours = validation_metrics(infos, process_weight=1.0, summary_weight=0.5)
    # verl's validation: one data source, one sample per prompt (val_kwargs.n=1)
    columns = {key: [info[key] for info in infos] for key in infos[0]}
    theirs = process_validation_metrics(
        ["synthetic"] * len(infos), [str(i) for i in range(len(infos))], columns
    )["synthetic"]
    between = []
    for k in names.SUCCESS_THRESHOLDS:
        for name in (names.val_success(k), names.val_tool_success(k)):
            flags = columns[success_key(name)]
            assert set(flags) <= {0, 1}, name
            assert theirs[success_key(name)]["mean@1"] == ours[name], name
            between += [name] if 0 < ours[name] < 1 else []
        # an absent summary is no success, whatever the rest of its total
        succeeded = columns[success_key(names.val_success(k))]
        assert not any(f for f, a in zip(succeeded, absent, strict=True) if a), k
    assert names.val_success(0.9) in between and names.val_tool_success(0.9) in between, ours


def test_ablation_no_hierr_flags_success_as_the_full_v82_reward_does(tokenizer, rows):
    """ablation=no_hierr on verl's reward side: R_tool 0, success@k and HierR the paper's.

    The same rollouts, the same judge answers (every third fails), scored under the ablation
    and under the full v8.2 preset: every success flag and every logged HierR score agree,
    rollout by rollout, while the ablation's routed tool score is 0 (or the no-call penalty).
    """
    infos = {}
    for recipe in (["ablation=no_hierr"], ["reward=hierr_v82"]):
        config = validate(compose_run(recipe))
        manager = SLCARewardManager(OmegaConf.create({OUR_KEY: our_section(config)}), tokenizer)
        manager.judge = FailsEveryThird(manager.judge)
        infos[recipe[0]] = [
            score(manager, *rollout(tokenizer, source)[:2], row)["reward_extra_info"]
            for row, other in zip(rows, [*rows[1:], rows[0]], strict=True)
            for source in (row, other)
        ]
    ablated, full = infos["ablation=no_hierr"], infos["reward=hierr_v82"]
    flags = [
        success_key(n)
        for k in names.SUCCESS_THRESHOLDS
        for n in (names.val_success(k), names.val_tool_success(k))
    ]
    for a, f in zip(ablated, full, strict=True):
        assert [a[key] for key in flags] == [f[key] for key in flags]
        assert a["slca/tool/hierr"] == f["slca/tool/score"]
        assert a["slca/tool/score"] in (0.0, -0.5)
    assert any(f[success_key(names.val_success(0.7))] for f in full)  # not all 0
