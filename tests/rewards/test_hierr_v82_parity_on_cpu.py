"""reward=hierr_v82 scores as the public v8.2 reward does, on the public inputs and random ones.

The public file is ``analysis/hierr_sweep/reward_fn_hierr_v82.py`` of github.com/SLCA-GRPO/SLCA-GRPO
at commit 68539c5; ``reference_v82.py`` models its summary side from its behaviour alone,
``reference_hierr.py`` its tool process score (the main reward's rules). The judge side is
checked where it leaves the process: the exact text our LLM judge sends to a real
OpenAI-compatible server on 127.0.0.1, against the text v8.2 renders for the same rollout.
"""

import dataclasses
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slca_exp.judges import build_judge
from slca_exp.judges.interaction import final_response, tool_interactions
from slca_exp.preflight.compose import compose_run
from slca_exp.preflight.validate import validate
from slca_exp.rewards import HierRReward
from slca_exp.services.loopback import DEFAULT_CONTENT, Behaviour
from tests.services.fixtures import loopback, server  # noqa: F401

from . import reference_hierr
from . import reference_v82 as v82
from .public_samples import GROUND_TRUTH, SAMPLE_1, SAMPLE_2, SELF_TESTS
from .rows import PARIS, row, tag, turn_break
from .strategies import cases

PUBLIC = [(SAMPLE_1, GROUND_TRUTH), (SAMPLE_2, GROUND_TRUTH), *SELF_TESTS]
PROCESS = [0.70, 0.50, 1.0, 1.0, 0.10 + 0.25 * 2 / 3 + 0.15 * 0.5 + 0.20 * 0.5]
"""The process score the public v8.2 file gives each of PUBLIC: samples 1 and 2 miss parallel
(a flat gold list is one step of three calls, the first block holds one); sample 2 also names
the wrong first tool (name F1 4/6, key and value 2/3); self-test 3 makes one call of two."""


def answer(label):
    """An answer in the output format v8.2's prompt asks for."""
    return (
        "<response>\n  <response_quality>\n    <reasoning>Fine.</reasoning>\n"
        f"    <rating>{label}</rating>\n  </response_quality>\n</response>"
    )


@pytest.fixture(scope="module")
def rewards():
    """reward=hierr_v82 and reward=hierr_paper as the presets compose."""
    return {
        name: HierRReward.from_config(validate(compose_run([f"reward={name}"])).reward)
        for name in ("hierr_v82", "hierr_paper")
    }


@pytest.fixture(scope="module")
def judge(loopback):  # noqa: F811
    """judge=openai on the module's loopback server: no cache, no retries."""
    cfg = validate(compose_run(["judge=openai", "reward=hierr_v82"])).judge
    cfg = dataclasses.replace(
        cfg, base_url=loopback.base_url, cache=False, max_retries=0, timeout_s=5.0
    )
    with build_judge(cfg) as built:
        yield built


def sent(server):  # noqa: F811
    return [r.json()["messages"][0]["content"] for r in server.completions]


def test_the_preset_is_the_paper_process_score_with_the_v82_judge(rewards):
    ours, main = rewards["hierr_v82"], rewards["hierr_paper"]
    assert (ours.variant, ours.judge_failure, ours.weights) == ("paper", "zero", main.weights)
    assert (ours.judge_view, ours.judge_prompt, ours.no_tool_response) == (
        "interaction",
        "hierr_judge_v82.txt",
        "judge",
    )
    assert (main.judge_view, main.judge_prompt, main.no_tool_response) == (
        "responses",
        None,
        "zero",
    )


@pytest.mark.parametrize(("index", "process"), list(enumerate(PROCESS)))
def test_public_inputs_score_as_the_public_v82_file(rewards, judge, server, index, process):  # noqa: F811
    text, gt = PUBLIC[index]
    server.configure(content=answer("good"))
    batch = rewards["hierr_v82"].score([text], [gt], judge)
    assert batch.tool[0].score == pytest.approx(process, abs=1e-12)  # float sum order
    assert batch.tool[0].score == pytest.approx(reference_hierr.score(text, gt)[0], abs=1e-12)
    assert batch.summary[0].score == 0.75 == v82.summary_score(answer("good"))
    assert float(batch.scores.total[0]) == pytest.approx(process + 0.75, rel=1e-6)  # float32
    assert sent(server) == [v82.request_text(text, gt)]


def test_the_public_samples_request_is_exactly_v82s(rewards, judge, server):  # noqa: F811
    rewards["hierr_v82"].score([SAMPLE_1, SAMPLE_2], [GROUND_TRUTH, GROUND_TRUTH], judge)
    first, second = sent(server)
    body = server.completions[0].json()  # v8.2: one user message, temperature 0, 8192 tokens
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert (body["temperature"], body["max_tokens"]) == (0.0, 8192)
    assert first == v82.request_text(SAMPLE_1, GROUND_TRUTH)
    assert second == v82.request_text(SAMPLE_2, GROUND_TRUTH)
    # What v8.2 shows and the main reward does not: the calls, all before the responses.
    calls = first.index("[Tool Call 1]\n[{")
    assert calls < first.index("[Tool Call 3]") < first.index("[Tool Response 1]\n{")
    assert "## Tool Interactions\n```\n[Tool Call 1]" in first
    assert "```\nHere is the step-by-step calculation" in first
    assert "<think>" not in first.split("## Model's Final Response")[1]


def test_the_main_preset_shows_the_same_rollout_differently(rewards, judge, server):  # noqa: F811
    rewards["hierr_paper"].score([SAMPLE_1], [GROUND_TRUTH], judge)
    (main,) = sent(server)
    assert main != v82.request_text(SAMPLE_1, GROUND_TRUTH) and "[Tool Call" not in main


# Rollouts on which the two rewards' rules part: (text, ground truth, v8.2 asks, main asks).
NO_RESPONSE = tag(PARIS) + "\nIt is 18 degrees Celsius in Paris right now."
ANSWERED = tag(PARIS) + turn_break('{"temp": 18}') + "It is 18 degrees Celsius in Paris."
IRRELEVANT = row([], question="Tell me a joke.")
RULES = [
    (NO_RESPONSE, row([[PARIS]]), True, False),  # no tool response: main scores 0
    ("I cannot help with that, sorry.", IRRELEVANT, True, False),  # right not to call
    ("It is sunny in Paris.", row([[PARIS]]), False, False),  # penalised no-call
    (tag(PARIS) + "<tool_response>{}</tool_response>ok", row([[PARIS]]), False, False),  # short
    (ANSWERED, row([[PARIS]]), True, True),
    ("Sunny, 18 degrees.", row([[PARIS]], allowed=()), False, False),  # no tools allowed
]


@pytest.mark.parametrize(("text", "gt", "asks", "main_asks"), RULES)
def test_the_no_response_rule_is_v82s(rewards, judge, server, text, gt, asks, main_asks):  # noqa: F811
    public = v82.decoded(text)  # what verl handed the public reward
    assert (v82.asks(public, gt), v82.asks(public, gt, main=True)) == (asks, main_asks)
    batch = rewards["hierr_v82"].score([text], [gt], judge)
    assert sent(server) == ([v82.request_text(public, gt)] if asks else [])
    expected = v82.score(public, gt, DEFAULT_CONTENT)
    assert batch.summary[0].score == expected[2]
    assert float(batch.scores.total[0]) == pytest.approx(expected[0], rel=1e-6)  # float32
    server.reset()
    main = rewards["hierr_paper"].score([text], [gt], judge)
    assert len(server.completions) == int(main_asks)
    assert main.summary[0].score == (0.75 if main_asks else 0.0)


def test_chat_control_tokens_are_left_out_and_role_lines_kept_as_verl_decodes():
    # verl decodes for the public reward with special tokens skipped; the role line it keeps
    # is part of v8.2's reply, so even "ok" after a tool response is long enough to be judged.
    text = tag(PARIS) + turn_break('{"temp": 18}') + "ok"
    assert "<|im_end|>" in text and final_response(text) == "assistant\nok"
    assert tool_interactions(text) == v82.tool_interactions(v82.decoded(text))
    assert tool_interactions(text).endswith('[Tool Response 1]\n{"temp": 18}')


@pytest.mark.parametrize(
    "label", ["very poor", "poor", "acceptable", "good", "excellent", " Very Poor\n", "GOOD"]
)
def test_the_score_of_each_rating_is_exactly_v82s(rewards, judge, server, label):  # noqa: F811
    server.configure(content=answer(label))
    batch = rewards["hierr_v82"].score([ANSWERED], [row([[PARIS]])], judge)
    assert batch.summary[0].score == v82.summary_score(answer(label))
    assert batch.summary[0].rating == v82.LABELS[label.strip().lower()]


@pytest.mark.parametrize(
    ("content", "ours", "theirs"),
    [
        ("<rating>good</rating>", 4, None),  # no <response_quality> around it
        (answer("4"), 4, None),  # a digit
        (answer("good."), 4, None),  # a trailing period
        (answer("very  poor"), 1, None),  # two spaces
        (answer("poor") + answer("excellent"), 5, 2),  # two ratings: v8.2 reads the first
    ],
)
def test_answers_our_parser_reads_otherwise_differ_from_v82(
    rewards,
    judge,
    server,  # noqa: F811
    content,
    ours,
    theirs,
):
    # Not v8.2's behaviour, and not the main reward's either: both public files share this
    # parser, and ours (every preset's) reads more answers. v8.2 counts a rating it cannot read
    # as a judge failure, 0 under judge_failure=zero.
    assert v82.rating(content) == theirs
    server.configure(content=content)
    batch = rewards["hierr_v82"].score([ANSWERED], [row([[PARIS]])], judge)
    assert (batch.summary[0].status, batch.summary[0].rating) == ("ok", ours)


def test_a_failed_judge_scores_zero_as_v82s(rewards, judge, server):  # noqa: F811
    server.configure(status=503)
    batch = rewards["hierr_v82"].score([ANSWERED], [row([[PARIS]])], judge)
    assert batch.summary[0].status == "failed"
    assert batch.summary[0].score == v82.summary_score(None) == 0.0


TAILS = st.sampled_from(
    [
        "",
        " It is 42 degrees in Paris today.",
        "\nshort",
        "<tool_response> 42 </tool_response>",
        "<tool_response>42</tool_response>\nThe answer is 42, as the tool said.",
        "<tool_call>",
        "<think>plan the reply</think>The answer, in full, is 42.",
    ]
)


@settings(max_examples=150, deadline=None)
@given(cases(), TAILS)
@example((SAMPLE_2, GROUND_TRUTH), "")
@example(("<tool_call>a</tool_call><think>x</think>", {"allowed_tools": ["f"]}), "")
@example(("<tool_response>x</tool_response>", {"allowed_tools": ["f"]}), "")
@example(("<tool_call>{}</tool_call>  <tool_call>", {"allowed_tools": ["f"]}), " ten chars!")
def test_random_rollouts_send_exactly_v82s_request(rewards, judge, loopback, case, tail):  # noqa: F811
    text, gt = case[0] + tail, case[1]
    assert final_response(text) == v82.final_response(text)
    assert tool_interactions(text) == v82.tool_interactions(text)
    loopback.reset()
    loopback.behaviour = Behaviour()  # the default answer: "good"
    batch = rewards["hierr_v82"].score([text], [gt], judge)
    asked = v82.asks(text, gt)
    assert sent(loopback) == ([v82.request_text(text, gt)] if asked else [])
    total, process, summary = v82.score(text, gt, DEFAULT_CONTENT)
    assert batch.summary[0].score == summary
    if not batch.tool[0].should_no_call:
        assert batch.tool[0].score == pytest.approx(process, abs=1e-12)  # float sum order
    assert float(batch.scores.total[0]) == pytest.approx(total, rel=1e-6, abs=1e-7)  # float32
    assert not math.isnan(float(batch.scores.total[0]))
