"""The rubric judge: rule v1's hand-computed cases; both rules' short-circuits, determinism and
adversarial inputs (rule v2's own cases: test_rubric_v2_on_cpu.py)."""

import math

import pytest

from slca_exp.config.services import JudgeConfig
from slca_exp.judges import JudgeRequest, JudgeView, build_judge, describe_judge
from slca_exp.judges.rubric import rubric_components
from tests.judges.rows import FAITHFUL, INVENTED, QUESTION, WEATHER, rollout


@pytest.fixture(params=["v1", "v2"])
def judge(request):
    """The rubric judge under each rule."""
    with build_judge(JudgeConfig(rubric_version=request.param)) as j:
        yield j


@pytest.fixture
def v1():
    with build_judge(JudgeConfig(rubric_version="v1")) as j:
        yield j


def rate(judge, reply, **kw):
    require = kw.pop("require_tool_response", True)
    (result,) = judge.score([JudgeRequest(QUESTION, rollout(reply, **kw), require)])
    return result


def components(reply, responses=(WEATHER,)):
    view = JudgeView.of(JudgeRequest(QUESTION, rollout(reply, responses)))
    return rubric_components(view)


def test_faithful_reply_is_excellent(v1):
    # facts: "paris", 21.4, "light rain", 81 -> all covered; both numbers grounded; 56 chars.
    c = components(FAITHFUL)
    assert (c["facts"], c["coverage"], c["faithfulness"], c["length"], c["repetition"]) == (
        4.0,
        1.0,
        1.0,
        1.0,
        0.0,
    )
    result = rate(v1, FAITHFUL)
    assert (result.status, result.rating, result.score, result.reason) == (
        "ok",
        5,
        1.0,
        "excellent",
    )


def test_invented_numbers_rate_poor(v1):
    # 35.2, 12 and 64 are nowhere in the tool response: P = 0; only "paris" covered: C = 1/4.
    # s = 0.4 * 0.25 + 0.4 * 0 + 0.2 * 1 = 0.3 -> rating 2.
    c = components(INVENTED)
    assert (c["coverage"], c["faithfulness"], c["invented"], c["s"]) == (0.25, 0.0, 3.0, 0.3)
    assert rate(v1, INVENTED).rating == 2 < rate(v1, FAITHFUL).rating


def test_rounded_numbers_and_small_counts_are_grounded():
    c = components("About 21 degrees and light rain in Paris, humidity 81 percent, 2 sources.")
    assert (c["coverage"], c["faithfulness"], c["invented"]) == (1.0, 1.0, 0.0)


def test_numbers_from_the_question_are_grounded():
    view = JudgeView("Convert 250 EUR to USD", ('{"rate": 1.08}',), "250 EUR is 270 USD at 1.08.")
    c = rubric_components(view)
    # 250 (question) and 1.08 (tool) are grounded; 270 is computed, so it counts as invented.
    assert (c["faithfulness"], c["invented"]) == (pytest.approx(2 / 3), 1.0)


def test_repetition_is_penalised(v1):
    # 6 copies of a 6-token sentence: 34 trigrams, 6 distinct -> D = 28/34.
    reply = "It is 21.4 °C in Paris. " * 6
    c = components(reply.strip())
    assert c["repetition"] == pytest.approx(1 - 6 / 34)
    assert c["s"] == pytest.approx((0.4 * 0.5 + 0.4 + 0.2) * 6 / 34)
    assert rate(v1, reply).rating == 1


def test_plain_text_responses_give_key_words():
    c = components("The museum opens at 9 and closes at 17:30.", ["Opening hours 9:00-17:30 daily"])
    # facts: opening, hours, 9, 0 ("00"), 17, 30, daily; the reply covers 9, 17 and 30.
    assert (c["facts"], c["coverage"], c["invented"]) == (7.0, 3 / 5, 0.0)


def test_short_circuits(judge):
    short = rate(judge, "Done.")
    assert (short.status, short.score, short.rating) == ("short_circuit", 0.0, None)
    assert short.reason == "reply shorter than 10 characters"
    none = rate(judge, FAITHFUL, responses=())
    assert (none.status, none.reason) == ("short_circuit", "no tool response")
    # A row that needs no call: a decline with no call and no response is rated, not skipped.
    (allowed,) = judge.score([JudgeRequest(QUESTION, "I cannot help with that request.", False)])
    assert allowed.status == "ok" and allowed.rating >= 3


def test_short_circuits_are_configurable():
    cfg = JudgeConfig(short_circuit_no_tool_response=False, min_reply_chars=0)
    with build_judge(cfg) as judge:
        assert rate(judge, "ok", responses=()).status == "ok"
    assert describe_judge(cfg)["min_reply_chars"] == 0


def test_deterministic_and_stats(judge):
    batch = [JudgeRequest(QUESTION, rollout(r)) for r in (FAITHFUL, INVENTED, "x")]
    assert judge.score(batch) == judge.score(batch)
    assert judge.stats() == {
        "requests": 6.0,
        "short_circuits": 2.0,
        "cache_hits": 0.0,
        "failures": 0.0,
    }


def test_describe_records_the_stand_in_and_its_rule():
    d = describe_judge(JudgeConfig())
    assert d["backend"] == "rubric" and d["prompt_version"] == "rubric-v2" and d["model"] is None
    assert describe_judge(JudgeConfig(rubric_version="v1"))["prompt_version"] == "rubric-v1"
    assert len(d["prompt_sha256"]) == 64 and "stand-in" not in d["backend"]


@pytest.mark.parametrize(
    "reply, responses",
    [
        ("💥 ünïcödé ✓ " * 20, ['{"a": "日本語 テキスト", "n": 1e400}']),
        ("NaN inf -0 1e309 " + "9" * 5000, ['{"x": NaN, "y": Infinity, "z": -1e999}']),
        ("lone \ud800 surrogate reply here", ["\udfff"]),
        ("a reply of normal length", ["[" * 10_000 + "]" * 10_000]),
        ("a reply of normal length", ['{"k": ' * 5000 + "1" + "}" * 5000]),
        ("1,234,567.89 and 3,5 and 10.0.0.1 and 1.2.3.4.5", ['{"v": 1234567.89}']),
        ("x" * 300_000, ["y" * 300_000]),
        ("It is 21.4 °C. " * 50_000, ['{"items": [' + ", ".join(['{"t": 21.4}'] * 50_000) + "]}"]),
    ],
)
def test_adversarial_inputs_never_raise(judge, reply, responses):
    result = rate(judge, reply, responses=responses)
    assert result.status == "ok" and 1 <= result.rating <= 5 and math.isfinite(result.score)
