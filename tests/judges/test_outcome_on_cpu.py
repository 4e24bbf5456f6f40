"""The outcome judges: the public parse rules, the fallback, failures, the facts rule."""

import json
import math

import pytest

from slca_exp.config.schema import OutcomeJudgeConfig, RewardConfig
from slca_exp.config.services import JudgeConfig
from slca_exp.core.rows import Row
from slca_exp.data.synthetic import build_rows
from slca_exp.judges import build_outcome_judge, describe_outcome, outcome_prompts, parse_verdict
from slca_exp.judges.outcome import CHECK_PROMPT, FALLBACK_PROMPT, render_interactions
from slca_exp.rewards.judging import OutcomeRequest
from slca_exp.services.loopback import Behaviour
from slca_exp.services.prompts import PROMPT_DIRS
from tests.judges.rows import CALL, FAITHFUL, INVENTED, QUESTION, WEATHER, rollout


def llm(server, tmp_path, **outcome):
    """A served judge's config and ``reward=exec_outcome``'s, with ``outcome`` changes."""
    judge = JudgeConfig(
        backend="openai",
        model="judge-model",
        base_url=server.base_url,
        timeout_s=0.3,
        max_retries=1,
        backoff_s=0.01,
        cache_path=str(tmp_path / "cache.sqlite"),
    )
    reward = RewardConfig(tool_reward="outcome", outcome=OutcomeJudgeConfig(**outcome))
    return reward, judge


def ask(reward, judge, *texts, question=QUESTION):
    with build_outcome_judge(reward, judge) as outcome:
        return outcome.score([OutcomeRequest(question, t) for t in texts])


def prompt_of(request):
    return request.json()["messages"][0]["content"]


# -- the public parse rules ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("Solved", "Solved"),
        ("solved.", "Solved"),
        ("The answer is SOLVED: it gives the temperature.", "Solved"),
        ("Unsolved", "Unsolved"),  # "unsolved" contains "solved"
        ("UNSOLVED - wrong city", "Unsolved"),
        ("Solved? No. Unsolved.", "Unsolved"),  # any "unsolved" wins
        ("Unsure", "Unsure"),
        ("I cannot tell.", "Unsure"),  # neither word: Unsure
        ("", "Unsure"),  # an empty reply: Unsure
        ("   \n ", "Unsure"),
        ("<think>it looks solved</think>Unsure", "Unsure"),  # think blocks are not the answer
    ],
)
def test_the_parse_rules_of_the_public_code(reply, verdict):
    assert parse_verdict(reply) == verdict


def test_solved_scores_one_and_anything_else_zero(server, tmp_path):
    reward, judge = llm(server, tmp_path)
    server.configure(content="Solved")
    (solved,) = ask(reward, judge, rollout(FAITHFUL))
    server.configure(content="Unsolved")
    (unsolved,) = ask(reward, judge, rollout(INVENTED))
    assert (solved.verdict, solved.score, solved.status) == ("Solved", 1.0, "ok")
    assert (unsolved.verdict, unsolved.score, unsolved.fallback) == ("Unsolved", 0.0, False)


def test_the_first_prompt_sees_the_question_and_the_final_answer_only(server, tmp_path):
    reward, judge = llm(server, tmp_path)
    server.configure(content="Solved")
    ask(reward, judge, rollout(FAITHFUL))
    (sent,) = server.completions
    prompt = prompt_of(sent)
    assert QUESTION in prompt and FAITHFUL in prompt
    assert "light rain" not in prompt.replace(FAITHFUL, "")  # no tool response shown
    assert "<tool_call>" not in prompt and "call the weather tool" not in prompt


@pytest.mark.parametrize("first", ["Unsure", "", "I cannot say"])
def test_unsure_asks_the_fallback_prompt_with_the_tool_interactions(server, tmp_path, first):
    reward, judge = llm(server, tmp_path)
    fallback = (PROMPT_DIRS["reward.outcome"] / FALLBACK_PROMPT).read_text().split("\n")[0]
    server.behaviour = Behaviour(
        content_fn=lambda r: "Solved" if fallback in prompt_of(r) else first
    )
    (result,) = ask(reward, judge, rollout(FAITHFUL))
    assert (result.verdict, result.score, result.fallback) == ("Solved", 1.0, True)
    one, two = server.completions
    assert fallback not in prompt_of(one) and fallback in prompt_of(two)
    shown = prompt_of(two)
    assert '"temp_c": 21.4' in shown and '"name": "weather"' in shown and FAITHFUL in shown
    assert "[Tool Call 1]" in shown and "[Tool Response 1]" in shown


def test_unsure_twice_is_zero(server, tmp_path):
    reward, judge = llm(server, tmp_path)
    server.configure(content="Unsure")
    (result,) = ask(reward, judge, rollout(FAITHFUL))
    assert (result.verdict, result.score, result.status, result.fallback) == (
        "Unsure",
        0.0,
        "ok",
        True,
    )
    assert len(server.completions) == 2


@pytest.mark.parametrize("reply", ["", "ok", "  short  "])
def test_a_final_answer_under_ten_characters_is_unsolved_without_asking(server, tmp_path, reply):
    reward, judge = llm(server, tmp_path)
    (result,) = ask(reward, judge, rollout(reply))
    assert (result.verdict, result.score, result.status) == ("Unsolved", 0.0, "short_circuit")
    assert server.completions == []


def test_a_failed_judge_leaves_the_verdict_absent_not_zero(server, tmp_path):
    reward, judge = llm(server, tmp_path)
    server.configure(status=500)
    (first,) = ask(reward, judge, rollout(FAITHFUL))
    assert first.status == "failed" and first.verdict is None and math.isnan(first.score)
    assert "HTTP 500" in first.reason
    # a failure on the fallback prompt is absent too
    fallback = (PROMPT_DIRS["reward.outcome"] / FALLBACK_PROMPT).read_text().split("\n")[0]
    server.configure(status=200, content="Unsure")
    server.route = lambda r: Behaviour(status=503) if fallback in prompt_of(r) else None
    (second,) = ask(reward, judge, rollout(FAITHFUL))
    assert second.status == "failed" and second.fallback and math.isnan(second.score)


def test_answers_are_cached_and_a_rerun_asks_nothing(server, tmp_path):
    reward, judge = llm(server, tmp_path)
    server.configure(content="Solved")
    ask(reward, judge, rollout(FAITHFUL))
    (again,) = ask(reward, judge, rollout(FAITHFUL))
    assert again.cached and again.verdict == "Solved" and len(server.completions) == 1


def test_the_recipe_records_both_prompts_and_their_hashes(server, tmp_path):
    reward, judge = llm(server, tmp_path)
    described = describe_outcome(reward, judge)
    texts = outcome_prompts(reward, judge)
    folder = PROMPT_DIRS["reward.outcome"]
    assert described["backend"] == "openai" and described["model"] == "judge-model"
    assert (described["prompt"], described["fallback_prompt"]) == (CHECK_PROMPT, FALLBACK_PROMPT)
    assert texts == {
        "outcome": (folder / CHECK_PROMPT).read_text(),
        "outcome_fallback": (folder / FALLBACK_PROMPT).read_text(),
    }
    edited = tmp_path / "mine.txt"
    edited.write_text("{{question}} -> {{answer}}: Solved or Unsolved?")
    mine = describe_outcome(llm(server, tmp_path, prompt=str(edited))[0], judge)
    assert mine["prompt_sha256"] != described["prompt_sha256"]
    assert mine["fallback_prompt_sha256"] == described["fallback_prompt_sha256"]


def test_auto_asks_the_judges_server_only_when_the_judge_asks_one(server, tmp_path):
    reward, judge = llm(server, tmp_path)
    assert describe_outcome(reward, judge)["backend"] == "openai"
    assert describe_outcome(reward, JudgeConfig())["backend"] == "facts"  # the rubric judge
    assert describe_outcome(RewardConfig(), judge) is None  # tool_reward=hierr: no outcome judge


def test_interactions_are_numbered_in_the_order_they_happened():
    text = f"{CALL}<tool_response>a</tool_response>{CALL}<tool_response>b</tool_response>done"
    shown = render_interactions(text)
    assert (
        shown.index("[Tool Call 1]")
        < shown.index("[Tool Response 1]")
        < shown.index("[Tool Call 2]")
        < shown.index("[Tool Response 2]")
    )
    assert render_interactions("no tools at all") == "(no tool calls)"


# -- the facts rule (deterministic CPU, the synthetic world) -------------------------------


ANSWERS = (json.dumps(WEATHER),)


def facts(text, answers=ANSWERS, needs_call=True):
    reward = RewardConfig(tool_reward="outcome")
    with build_outcome_judge(reward, JudgeConfig()) as judge:
        (result,) = judge.score([OutcomeRequest(QUESTION, text, tuple(answers), needs_call)])
    return result


def test_facts_solved_when_the_answers_were_obtained_and_stated():
    assert facts(rollout(FAITHFUL)).verdict == "Solved"


def test_facts_unsolved_when_the_answer_misstates_a_fact():
    assert facts(rollout(INVENTED)).verdict == "Unsolved"
    assert facts(rollout("It is 21.4 degrees in Paris with light rain.")).verdict == "Unsolved"


def test_facts_unsolved_when_the_facts_were_not_obtained_from_a_tool():
    # The answer states every fact, but the tool answered something else.
    other = {"city": "Paris", "temp_c": 9.0, "condition": "sunny", "humidity": 40}
    assert facts(rollout(FAITHFUL, responses=(other,))).verdict == "Unsolved"
    assert facts(f"{CALL}{FAITHFUL}").verdict == "Unsolved"  # no tool response at all


def test_facts_on_a_row_that_needs_no_call_solved_only_without_a_call():
    decline = "Sorry, I can't help with that with my tools."
    assert facts(decline, answers=(), needs_call=False).verdict == "Solved"
    assert facts(rollout(decline), answers=(), needs_call=False).verdict == "Unsolved"


def test_facts_cannot_decide_a_row_that_records_no_answers():
    result = facts(rollout(FAITHFUL), answers=())
    assert result.status == "failed" and math.isnan(result.score) and "records no" in result.reason


def test_facts_short_answer_is_unsolved_by_the_rule():
    result = facts(rollout("21.4 C"))
    assert (result.verdict, result.status) == ("Unsolved", "short_circuit")


def gold_trajectory(row):
    """The gold calls, their recorded answers and the gold reply, as one rollout text."""
    view = Row(row)
    parts = [
        f"<tool_call>{json.dumps({'name': a['name'], 'arguments': a['arguments']})}</tool_call>"
        f"<tool_response>{a['content']}</tool_response>"
        for a in view.recorded()
    ]
    return "".join(parts) + row["extra_info"]["reply"]


def test_facts_solves_every_gold_trajectory_of_the_synthetic_world_and_no_wrong_one():
    rows = build_rows(300, "val", 11)
    solved = wrong_solved = 0
    for row in rows:
        view = Row(row)
        answers = tuple(a["content"] for a in view.recorded())
        needs = bool(answers)
        text = gold_trajectory(row)
        solved += facts(text, answers, needs).verdict == "Solved"
        if needs:  # the same tool work, and a final answer that states none of it
            wrong = text[: len(text) - len(row["extra_info"]["reply"])] + "Here is what I found."
            wrong_solved += facts(wrong, answers, needs).verdict == "Solved"
    assert solved == len(rows)
    assert wrong_solved == 0
