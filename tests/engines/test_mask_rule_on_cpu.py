"""``engine.rl.mask_rule`` in the local engine, on a real batch of the tiny tool caller.

Under ``parity`` (the paper's rule) a rollout cut off on a tool call has that call read as its
summary; under ``corrected`` it has no summary and all its learnable tokens are tool. The engine
counts such rollouts every step (``segment/cutoff_frac``).
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.backbones.hf import load_folder
from slca_exp.config.schema import RewardConfig
from slca_exp.config.services import JudgeConfig
from slca_exp.core import names
from slca_exp.engines.local.rollout import RolloutSettings
from slca_exp.engines.local.update import segments
from slca_exp.estimators import EstimatorParams, get_estimator
from slca_exp.estimators.segments import split_segments
from slca_exp.judges import build_judge
from slca_exp.preflight.compose import compose_run
from slca_exp.preflight.validate import validate
from slca_exp.recipe import build_recipe
from slca_exp.rewards import HierRReward
from tests.engines.tool_caller import roller_for
from tests.estimators.strategies import batches


@pytest.fixture(scope="module")
def batch(tool_caller):
    """32 rollouts (8 prompts x 4) with one calling turn allowed, scored by HierR and the judge."""
    backbone = load_folder(tool_caller.folder, name="tool-caller", dtype="float32")
    roller = roller_for(backbone)
    torch.manual_seed(0)
    rolls = roller.run(tool_caller.rows[:8], 4, RolloutSettings(1, 64, 256))
    judge = build_judge(JudgeConfig())
    truths = [row["reward_model"]["ground_truth"] for row in rolls.rows]
    scored = HierRReward.from_config(RewardConfig()).score(rolls.texts, truths, judge)
    judge.close()
    flags = rolls.ends_on_tool_call()
    assert 0 < sum(flags) < len(flags)  # both kinds in the batch
    return rolls, rolls.batch(roller.pad_id), scored, flags, backbone.tokenizer


def last_turn(ids, mask):
    """The token ids of a rollout's last generated run."""
    end = max(k for k, m in enumerate(mask) if m) + 1
    start = end
    while start > 0 and mask[start - 1]:
        start -= 1
    return ids[start:end]


def test_a_flag_marks_a_last_turn_holding_a_tool_call(batch):
    rolls, _, _, flags, tok = batch
    for ids, mask, flag, cut in zip(
        rolls.response_ids, rolls.response_mask, flags, rolls.truncated, strict=True
    ):
        assert flag == ("<tool_call>" in tok.decode(last_turn(ids, mask)))
        if cut and flag:  # cut off: nothing the environment wrote follows that turn
            assert mask[-1] == 1


def test_corrected_turns_a_cut_off_rollouts_summary_into_tool(batch):
    rolls, packed, _, flags, tok = batch
    mask = packed.response_mask
    parity = segments(mask, flags, "parity")
    corrected = segments(mask, flags, "corrected")
    plain = split_segments(mask)
    assert torch.equal(parity.tool_mask, plain.tool_mask)
    assert torch.equal(parity.summary_mask, plain.summary_mask)
    for i, flag in enumerate(flags):
        if flag:
            # parity reads the unanswered call as the summary; corrected has no summary
            summary = packed.response_ids[i][parity.summary_mask[i]].tolist()
            assert "<tool_call>" in tok.decode(summary)
            assert not corrected.summary_mask[i].any()
            assert torch.equal(corrected.tool_mask[i], mask[i].bool())
        else:
            assert torch.equal(corrected.summary_mask[i], parity.summary_mask[i])
            assert torch.equal(corrected.tool_mask[i], parity.tool_mask[i])


@pytest.mark.parametrize("estimator", ["slca_grpo", "toolpo_grpo", "grpo"])
def test_every_estimator_routes_a_cut_off_rollouts_tokens_as_tool(batch, estimator):
    rolls, packed, scored, flags, _ = batch
    split = segments(packed.response_mask, flags, "corrected")
    adv = get_estimator(estimator)(split, rolls.group, scored.scores, EstimatorParams())
    cut = torch.tensor(flags)
    assert not adv.summary_mask[cut].any()
    learnable = packed.response_mask.bool()
    for i in torch.nonzero(cut).flatten().tolist():
        row = adv.advantages[i][learnable[i]]
        assert torch.equal(row, torch.full_like(row, float(adv.tool_adv[i])))
    present = [
        not flag and math.isfinite(float(s))
        for flag, s in zip(flags, scored.scores.summary.tolist(), strict=True)
    ]
    if estimator == "slca_grpo":
        share = adv.stats[names.present_frac("summary")]
        assert share == pytest.approx(sum(present) / len(present))


def test_only_the_summary_segment_changes_between_the_rules(batch):
    rolls, packed, scored, flags, _ = batch
    estimator, params = get_estimator("slca_grpo"), EstimatorParams()
    parity = estimator(
        segments(packed.response_mask, flags, "parity"), rolls.group, scored.scores, params
    )
    corrected = estimator(
        segments(packed.response_mask, flags, "corrected"), rolls.group, scored.scores, params
    )
    cut = torch.tensor(flags)
    kept = ~cut
    assert torch.equal(parity.summary_mask[kept], corrected.summary_mask[kept])
    # a cut-off rollout's summary advantage (scored on a tool call) no longer reaches any token
    assert parity.summary_mask[cut].any() and not corrected.summary_mask[cut].any()


@given(data=batches(), flags=st.data())
@settings(max_examples=60, deadline=None)
def test_segments_partition_the_mask_under_either_rule(data, flags):
    mask = data[0]
    b = mask.shape[0]
    ends = flags.draw(st.lists(st.booleans(), min_size=b, max_size=b))
    plain = split_segments(mask)
    for rule in ("parity", "corrected"):
        split = segments(mask, ends, rule)
        tool, summary = split.tool_mask, split.summary_mask
        assert not (tool & summary).any() and torch.equal(tool | summary, mask.bool())
        for i, end in enumerate(ends):
            if rule == "corrected" and end:
                assert not summary[i].any()
            else:
                assert torch.equal(summary[i], plain.summary_mask[i])


def test_an_unknown_rule_names_the_key():
    with pytest.raises(ValueError, match=r"engine\.rl\.mask_rule='last'"):
        segments(torch.ones(1, 2), [False], "last")


def test_the_rule_is_recorded_with_the_engine_and_defaults_to_the_papers():
    default = build_recipe(validate(compose_run([])))
    verl = build_recipe(validate(compose_run(["engine=verl"])))  # engine.verl is verl's own
    assert default.engine["rl"]["mask_rule"] == "parity" == verl.engine["verl"]["mask_rule"]
    corrected = build_recipe(validate(compose_run(["engine.rl.mask_rule=corrected"])))
    assert corrected.engine["rl"]["mask_rule"] == "corrected"
    assert corrected.fingerprint == default.fingerprint  # the five components are unchanged


def test_the_cutoff_metric_is_documented_and_not_an_estimator_stat():
    assert names.SEGMENT_CUTOFF_FRAC in names.METRICS
    assert names.SEGMENT_CUTOFF_FRAC not in names.ESTIMATOR_STATS
