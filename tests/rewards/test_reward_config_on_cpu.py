"""The reward group: presets, validation of the weights, normalisation recorded in the config."""

import pytest

from slca_exp.core.problems import ConfigError
from slca_exp.preflight.compose import check_overrides, compose_run
from slca_exp.preflight.validate import validate
from slca_exp.rewards import HierRReward, HierRWeights

PRESETS = {
    "hierr": (0.10, 0.25, 0.15, 0.20, 0.30),
    "hierr_paper": (0.10, 0.25, 0.15, 0.20, 0.30),
    "hierr_uniform": (0.20, 0.20, 0.20, 0.20, 0.20),
    "hierr_name_heavy": (0.05, 0.40, 0.15, 0.15, 0.25),
    "hierr_value_heavy": (0.05, 0.20, 0.20, 0.35, 0.20),
}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_carry_the_paper_weights(preset):
    run = validate(compose_run([f"reward={preset}"]))
    w = run.reward.tool_weights
    assert (w.format, w.name, w.key, w.value, w.parallel) == pytest.approx(PRESETS[preset])
    assert run.reward.name == preset
    reward = HierRReward.from_config(run.reward)
    expected = ("paper", "zero") if preset == "hierr_paper" else ("strict", "absent")
    assert (reward.variant, reward.judge_failure) == expected


def test_weights_must_sum_to_one_unless_normalised():
    bad = ["reward.tool_weights.format=0.5"]
    (problem,) = check_overrides(bad)[1]
    assert problem.key == "reward.tool_weights" and "sum to 1" in problem.what
    assert "reward.normalize=true" in problem.fix
    run = validate(compose_run([*bad, "reward.normalize=true"]))
    w = run.reward.tool_weights
    total = 0.5 + 0.25 + 0.15 + 0.20 + 0.30
    assert w.format == pytest.approx(0.5 / total) and w.parallel == pytest.approx(0.3 / total)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("reward.tool_weights.name=-0.1", "reward.tool_weights.name"),
        ("reward.tool_weights.value=inf", "reward.tool_weights.value"),
        ("reward.process_weight=nan", "reward.process_weight"),
        ("reward.summary_weight=-1", "reward.summary_weight"),
        ("reward.no_call_penalty=0.5", "reward.no_call_penalty"),
        ("reward.variant=loose", "reward.variant"),
        ("reward.judge_failure=drop", "reward.judge_failure"),
    ],
)
def test_bad_reward_values_name_their_key(override, key):
    problems = check_overrides([override])[1]
    assert key in [p.key for p in problems], problems


def test_normalised_weights_are_what_the_reward_uses():
    run = validate(
        compose_run(
            ["reward=hierr_uniform", "reward.tool_weights.name=0.6", "reward.normalize=true"]
        )
    )
    w = HierRReward.from_config(run.reward).weights
    assert (w.format, w.name, w.key, w.value, w.parallel) == pytest.approx(
        (1 / 7, 3 / 7, 1 / 7, 1 / 7, 1 / 7)
    )
    assert isinstance(w, HierRWeights)


def test_exec_outcome_is_the_outcome_reward_on_the_public_hierr_parts():
    run = validate(compose_run(["reward=exec_outcome"]))
    reward = HierRReward.from_config(run.reward)
    assert (reward.tool_reward, reward.variant, reward.judge_failure) == (
        "outcome",
        "paper",
        "absent",
    )
    assert (run.reward.outcome.backend, run.reward.outcome.min_answer_chars) == ("auto", 10)
    assert HierRReward.from_config(validate(compose_run([])).reward).tool_reward == "hierr"


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (["reward.outcome.backend=oracle"], "reward.outcome.backend", "oracle"),
        (["reward.outcome.backend=openai"], "reward.outcome.backend", "judge.backend=rubric"),
        (["reward.outcome.prompt=nowhere.txt"], "reward.outcome.prompt", "nowhere.txt"),
        (["reward.outcome.fallback_prompt=gone.txt"], "reward.outcome.fallback_prompt", "gone"),
        (["reward.outcome.min_answer_chars=-1"], "reward.outcome.min_answer_chars", ""),
        (["reward.tool_reward=verdict"], "reward.tool_reward", "verdict"),
    ],
)
def test_a_bad_outcome_judge_is_refused_naming_its_key(overrides, key, says):
    with pytest.raises(ConfigError) as err:
        validate(compose_run(["reward=exec_outcome", *overrides]))
    (problem,) = [p for p in err.value.problems if p.key == key]
    assert says in problem.what and problem.fix


def test_the_outcome_judges_checks_apply_only_under_the_outcome_reward():
    # a HierR run does not ask the outcome judge, so its settings are not checked
    validate(compose_run(["reward.outcome.backend=openai"]))
