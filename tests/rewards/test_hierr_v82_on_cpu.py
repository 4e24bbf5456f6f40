"""reward=hierr_v82 as a recipe: it composes on both judges, its keys are checked and recorded,
the rubric judge honours its rule, and the "w/o HierR" ablation (all five tool weights 0) runs."""

import dataclasses

import pytest
from hypothesis import given, settings
from omegaconf import OmegaConf

from slca_exp.config.services import JudgeConfig
from slca_exp.core import names
from slca_exp.core.problems import ConfigError
from slca_exp.judges import JudgeView, RubricJudge, build_judge, describe_judging, rubric_verdict
from slca_exp.preflight.compose import check_overrides, compose_run
from slca_exp.preflight.validate import problems_of, validate
from slca_exp.rewards import HierRReward
from slca_exp.tracking.mlflow import flatten_params

from . import reference_hierr
from . import reference_v82 as v82
from .public_samples import GROUND_TRUTH, SAMPLE_1, SAMPLE_2
from .rows import PARIS, REPLY, row, tag, turn_break
from .strategies import cases

ZERO = [f"reward.tool_weights.{k}=0" for k in ("format", "name", "key", "value", "parallel")]
"""The "w/o HierR" ablation: every tool process weight 0 (the public launcher's SLCA_WEIGHT_*)."""
NO_RESPONSE = tag(PARIS) + "\nIt is 18 degrees Celsius in Paris right now."
ANSWERED = tag(PARIS) + turn_break('{"temp": 18}') + REPLY


@pytest.mark.parametrize("experiment", ["smoke", "paper_7b"])
def test_the_preset_composes_and_validates_on_both_judges(experiment):
    cfg = compose_run([f"experiment={experiment}", "reward=hierr_v82"])
    assert cfg.judge.backend == ("rubric" if experiment == "smoke" else "openai")
    found = [p.key for p in problems_of(cfg)]
    assert not [k for k in found if k.split(".")[0] in ("reward", "judge")], found
    if experiment == "smoke":
        run = validate(cfg)
        assert (run.reward.name, run.reward.variant, run.reward.judge_failure) == (
            "hierr_v82",
            "paper",
            "zero",
        )


def test_the_new_keys_are_recorded_with_the_run_and_main_recipe_keeps_its_defaults():
    params = flatten_params(OmegaConf.to_container(compose_run(["reward=hierr_v82"])))
    assert {
        k: params[f"reward.{k}"] for k in ("judge_view", "judge_prompt", "no_tool_response")
    } == {
        "judge_view": "interaction",
        "judge_prompt": "hierr_judge_v82.txt",
        "no_tool_response": "judge",
    }
    assert params["reward.judge_prompt_version"] == "hierr-judge-v82"
    main = validate(compose_run(["experiment=smoke", "reward=hierr_paper"])).reward
    assert (main.judge_view, main.judge_prompt, main.no_tool_response) == (
        "responses",
        None,
        "zero",
    )
    assert describe_judging(main) is None  # nothing new in the main recipe's record


def test_what_the_recipe_should_record_of_the_judging():
    described = describe_judging(validate(compose_run(["reward=hierr_v82"])).reward)
    assert described["judge_view"] == "interaction" and described["no_tool_response"] == "judge"
    assert (described["judge_prompt"], described["judge_prompt_version"]) == (
        "hierr_judge_v82.txt",
        "hierr-judge-v82",
    )
    assert len(described["judge_prompt_sha256"]) == 64


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        # The judge's own template shows the tool responses, which this view does not fill.
        (["judge=openai", "reward.judge_prompt=null"], "reward.judge_view", "{{tool_responses}}"),
        (["reward.judge_prompt=gone_v9.txt"], "reward.judge_prompt", "gone_v9.txt"),
        (["reward.judge_view=calls"], "reward.judge_view", "calls"),
        (["reward.no_tool_response=skip"], "reward.no_tool_response", "skip"),
    ],
)
def test_bad_judging_keys_are_refused_naming_the_key_and_the_fix(overrides, key, says):
    with pytest.raises(ConfigError) as err:
        validate(compose_run(["reward=hierr_v82", *overrides]))
    (problem,) = [p for p in err.value.problems if p.key == key]
    assert says in problem.what and problem.fix


def test_a_template_for_the_other_view_is_refused():
    _, problems = check_overrides(["judge=openai", "reward.judge_prompt=hierr_judge_v82.txt"])
    (problem,) = problems
    assert problem.key == "reward.judge_prompt" and "{{tool_interactions}}" in problem.what


def test_a_judge_that_does_not_show_the_view_is_refused(monkeypatch):
    monkeypatch.setattr(RubricJudge, "views", ("responses",))
    _, problems = check_overrides(["reward=hierr_v82"])
    (problem,) = problems
    assert problem.key == "reward.judge_view" and "judge.backend=rubric" in problem.what
    assert "reward.judge_view=responses" in problem.fix


def test_the_rubric_judge_rates_the_v82_reply_and_judges_rollouts_without_a_response():
    rubric = build_judge(JudgeConfig())
    v82_reward = HierRReward.from_config(validate(compose_run(["reward=hierr_v82"])).reward)
    main = HierRReward.from_config(validate(compose_run(["reward=hierr_paper"])).reward)
    gt = row([[PARIS]])
    ours = v82_reward.score([NO_RESPONSE, ANSWERED], [gt, gt], rubric).summary
    view = JudgeView("Weather?", (), v82.final_response(NO_RESPONSE))
    assert (ours[0].status, ours[0].rating) == ("ok", rubric_verdict(view)[0])
    answered = JudgeView("Weather?", ('{"temp": 18}',), "assistant\n" + REPLY)  # as verl decodes
    assert ours[1].rating == rubric_verdict(answered)[0]
    assert main.score([NO_RESPONSE], [gt], rubric).summary[0].status == "short_circuit"


def test_without_hierr_validates_only_when_all_five_weights_are_zero():
    run = validate(compose_run(["reward=hierr_v82", *ZERO]))
    assert dataclasses.astuple(run.reward.tool_weights) == (0.0, 0.0, 0.0, 0.0, 0.0)
    assert [p.key for p in check_overrides([*ZERO[:4], "reward.tool_weights.parallel=0.5"])[1]] == [
        "reward.tool_weights"
    ]
    (problem,) = check_overrides([*ZERO, "reward.normalize=true"])[1]
    assert "at least one positive" in problem.what


def test_without_hierr_the_tool_reward_is_out_of_the_objective_and_still_logged():
    rubric = build_judge(JudgeConfig())
    ablated = HierRReward.from_config(validate(compose_run(["reward=hierr_v82", *ZERO])).reward)
    full = HierRReward.from_config(validate(compose_run(["reward=hierr_v82"])).reward)
    texts = [SAMPLE_1, SAMPLE_2, "No tools: the answer is 0.5."]  # the last: a penalised no-call
    truths = [GROUND_TRUTH] * 3
    got, had = ablated.score(texts, truths, rubric), full.score(texts, truths, rubric)
    assert got.scores.tool.tolist() == [0.0, 0.0, 0.0]  # R_tool contributes nothing
    assert got.scores.total.tolist()[:2] == got.scores.summary.tolist()[:2]
    assert got.scores.total.tolist()[2] == -0.5  # the no-call penalty still applies
    assert [s.score for s in got.summary] == [s.score for s in had.summary]
    # The process score is computed with the run's weights, as v8.2 logs its process_score:
    # 0 on every rollout that calls a tool; the components are logged unweighted.
    assert [t.score for t in got.tool] == [0.0, 0.0, -0.5]
    zero = dict.fromkeys(reference_hierr.WEIGHTS, 0.0)
    assert [v82.score(t, GROUND_TRUTH, None, zero)[1] for t in texts] == [0.0, 0.0, 0.0]
    # reward/tool/hierr/mean is R_tool, the penalty included, under every preset; v8.2 logs
    # process_score 0 on a penalised no-call (reward/tool/no_call/frac counts those).
    assert got.stats[names.REWARD_TOOL_HIERR_MEAN] == pytest.approx(-0.5 / 3)
    assert got.stats[names.REWARD_NO_CALL_FRAC] == pytest.approx(1 / 3)
    for part in ("format", "name", "key", "value", "parallel"):
        metric = names.tool_component(part)
        assert got.stats[metric] == had.stats[metric]
    assert got.stats[names.tool_component("name")] == pytest.approx((1 + 2 / 3 + 0) / 3)


@pytest.fixture(scope="module")
def no_hierr():
    """ablation=no_hierr's reward, the full v8.2 preset's, and the rubric judge."""
    ablated = HierRReward.from_config(validate(compose_run(["ablation=no_hierr"])).reward)
    full = HierRReward.from_config(validate(compose_run(["reward=hierr_v82"])).reward)
    return ablated, full, build_judge(JudgeConfig())


@settings(max_examples=60, deadline=None)
@given(case=cases())
def test_ablation_no_hierr_trains_on_no_tool_reward_and_logs_the_papers_process_score(
    no_hierr, case
):
    """ablation=no_hierr: R_tool is 0 (the penalty aside), the logged HierR score the paper's.

    The logged score and its parts are exactly the full v8.2 preset's, rollout by rollout: the
    same scorer under reward.logged_weights (the paper's), so equal to the last bit.
    """
    text, truth = case
    ablated, full, rubric = no_hierr
    got, had = ablated.score([text], [truth], rubric), full.score([text], [truth], rubric)
    (tool,), (logged,), (paper,) = got.tool, got.hierr, had.tool
    assert tool.score == (ablated.no_call_penalty if tool.should_no_call else 0.0)
    assert logged.score == paper.score and logged.components == paper.components
    assert tool.components == paper.components
    assert got.stats[names.REWARD_TOOL_HIERR_MEAN] == had.stats[names.REWARD_TOOL_HIERR_MEAN]


def test_ablation_no_hierr_reads_success_at_k_under_the_papers_weights(no_hierr):
    """val/success@k of ablation=no_hierr: the full preset's totals, not the summary alone.

    Trained on the summary alone, a total can never reach 0.7 of w_process + w_summary; the
    paper's success of this row is read from the same scores as the full method's.
    """
    ablated, full, rubric = no_hierr
    texts = [SAMPLE_1, SAMPLE_2, "No tools: the answer is 0.5."]
    got = ablated.score(texts, [GROUND_TRUTH] * 3, rubric)
    had = full.score(texts, [GROUND_TRUTH] * 3, rubric)
    assert got.success_totals == had.success_totals == had.scores.total.tolist()
    assert got.scores.total.tolist() != got.success_totals  # trained on the summary alone
    assert had.evaluated is None  # no logged weights: success@k reads the routed scores
