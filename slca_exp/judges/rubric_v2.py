"""Rule ``rubric-v2`` of the rubric judge: a reply is rated on what it states.

Under ``rubric-v1`` (:mod:`slca_exp.judges.rubric`) a reply with no numbers was fully faithful
for free and earned a fifth of the scale for its length, so filler, lorem ipsum or a pasted tool
call rated "good", above a reply that tried and got one number wrong. v2 keeps v1's reading of
texts (rules 1-3 there: tokens, facts of a response, when a reply states a fact) and rates:

1. **Not a summary: 1.** In this order, with the reason:

   - *tool-call markup*: the reply holds a ``<tool_call>``/``<tool_response>`` tag (opening or
     closing) or a chat-template token (``<|...|>``);
   - *a JSON object*: the reply opens with ``{`` or ``[``, or holds a JSON member (``{"key":``);
   - *an echo of the question*: it states no new fact (rule 2) and at least 60% of its content
     tokens (numbers, and words of 2 letters or more that are not stop words) are the question's.

2. **New facts.** The facts of each tool response (v1's rule 2), less

   - identifiers: a JSON string with no whitespace that has a letter followed by a digit
     (``res-d40715``, ``AF123``, a UUID) or is snake_case (``get_time``): ids, codes and echoed
     tool names are not what a summary reports (``72°F`` and ``Asia/Tokyo`` stay facts);
   - facts the question already states: naming the city the user asked about reports nothing.

   The first 64 distinct new facts of each response count.

3. **Says nothing: 1.** Some response has new facts and the reply states none of them.

4. **Coverage tier.** Per response with new facts, ``c = min(1, stated / min(F, 5))`` (five facts
   of a large response are complete, as in v1); ``C`` is their mean (1 when no response has new
   facts, so a decline of a tool that told nothing is not punished). Repetition counts beyond a
   quarter: ``R = min(1, (1 - D) / 0.75)`` with v1's trigram repetition ``D``; length counts above
   4,000 characters: ``L = min(1, 4000 / n)``. ``q = C * R * L`` rates 5 when 1 (complete, not
   repetitive, not overlong), 4 from 0.6, 3 from 0.3, else 2.

5. **Invented numbers.** Each number the reply invents (v1's rule 5: not a number of the tool
   responses, identifiers included, nor of the question; integers 0 to 10 are ignored) costs one
   point, down to 1. Faithfulness thus counts only for what the reply states: saying nothing
   earns nothing, and a wrong number always costs.

The reason of a rating names its tier and, for a 1 or a deduction, why (``"very poor: not a
summary (tool-call markup)"``, ``"good: 1 invented number"``).
"""

from __future__ import annotations

import re
from typing import Any

from slca_exp.judges.base import JudgeView
from slca_exp.judges.rubric import PARAMS as V1_PARAMS
from slca_exp.judges.rubric import STOP_WORDS, Fact, Statement, read_response
from slca_exp.rewards.judging import LABELS
from slca_exp.rewards.toolcalls import TOOL_CALL, TOOL_RESPONSE

RUBRIC_V2 = "rubric-v2"

PARAMS_V2: dict[str, Any] = {
    "reading": "rubric-v1 rules 1-3",
    "full_coverage_facts": 5,
    "max_facts": 64,
    "tiers": [1.0, 0.6, 0.3],
    "free_repetition": 0.25,
    "max_chars": 4000,
    "echo_share": 0.6,
    "ignored_small_int": V1_PARAMS["ignored_small_int"],
    "markup": [*TOOL_CALL, *TOOL_RESPONSE, "<|"],
}
"""The rule's constants; their hash is recorded as the judge's ``prompt_sha256``."""

_TIERS = PARAMS_V2["tiers"]
_FULL = PARAMS_V2["full_coverage_facts"]
# A JSON member opening: `{"key":` or `, "key":` after a brace was seen (one linear scan).
_JSON_MEMBER = re.compile(r'\{\s*"[^"\n]{0,200}"\s*:')
_CONTENT = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]{2,}")


def not_a_summary(reply: str) -> str | None:
    """Why ``reply`` is tool-call markup or a JSON object (rule 1), or ``None``.

    >>> not_a_summary('{"name": "translate"}</tool_call>'), not_a_summary('{"price": 3}')
    ('tool-call markup', 'a JSON object')
    >>> not_a_summary("IBM trades at 592.11 USD.") is None
    True

    """
    if any(tag in reply for tag in PARAMS_V2["markup"]):
        return "tool-call markup"
    stripped = reply.lstrip()
    if stripped[:1] in ("{", "[") or _JSON_MEMBER.search(reply[: V1_PARAMS["analysed_chars"]]):
        return "a JSON object"
    return None


def _content(text: str) -> list[str]:
    tokens = _CONTENT.findall(text[: V1_PARAMS["analysed_chars"]].lower())
    return [t for t in tokens if t not in STOP_WORDS]


def echo_share(reply: str, question: str) -> float:
    """The share of the reply's content tokens that the question holds (0 when it has none)."""
    said = _content(reply)
    if not said:
        return 0.0
    asked = set(_content(question))
    return sum(t in asked for t in said) / len(said)


def new_facts(facts: list[Fact], question: Statement) -> list[Fact]:
    """The facts of a response (identifiers left out) a summary should report (rule 2).

    Those the question does not state, the first 64 distinct.
    """
    return [f for f in dict.fromkeys(facts) if not question.states(f)][: PARAMS_V2["max_facts"]]


def rubric_v2_components(view: JudgeView) -> dict[str, Any]:
    """Everything rule ``rubric-v2`` reads of one rollout, with its rating and reason.

    Example:
        >>> v = JudgeView("Weather in Paris?", ('{"city": "Paris", "temp_c": 21.4}',),
        ...               "It is 21.4 degrees in Paris right now.")
        >>> c = rubric_v2_components(v)
        >>> c["facts"], c["stated"], c["coverage"], c["rating"], c["reason"]
        (1, 1, 1.0, 5, 'excellent')

    """
    question = Statement(view.question)
    reply = Statement(view.reply)
    grounding: set[tuple[int, str]] = set(question.forms)
    with_facts = []
    for response in view.tool_responses:
        facts, forms = read_response(response)
        grounding |= forms
        if facts := new_facts(facts, question):
            with_facts.append(facts)
    said = {f: reply.states(f) for facts in with_facts for f in facts}  # distinct facts
    stated = [sum(said[f] for f in facts) for facts in with_facts]
    coverage = (
        sum(min(1.0, s / min(len(f), _FULL)) for s, f in zip(stated, with_facts, strict=True))
        / len(with_facts)
        if with_facts
        else 1.0
    )
    invented = sum(
        1
        for d, s, v in reply.numbers
        if (d, s) not in grounding and not (d == 0 and abs(v) <= PARAMS_V2["ignored_small_int"])
    )
    repetition = reply.repetition()
    n = len(view.reply)
    q = (
        coverage
        * min(1.0, (1.0 - repetition) / (1.0 - PARAMS_V2["free_repetition"]))
        * min(1.0, PARAMS_V2["max_chars"] / n if n else 1.0)
    )
    out: dict[str, Any] = {
        "facts": len(said),
        "stated": sum(said.values()),
        "coverage": coverage,
        "repetition": repetition,
        "invented": invented,
        "q": q,
    }
    why = not_a_summary(view.reply)
    if why is None and not any(stated):
        share = echo_share(view.reply, view.question)
        if share >= PARAMS_V2["echo_share"]:
            why = "an echo of the question"
        elif with_facts:
            nfacts = out["facts"]
            return {
                **out,
                "rating": 1,
                "reason": f"{LABELS[0]}: states none of the {nfacts} "
                f"fact{'s' if nfacts != 1 else ''} of the tool responses",
            }
    if why is not None:
        return {**out, "rating": 1, "reason": f"{LABELS[0]}: not a summary ({why})"}
    base = 2 + sum(q >= t - 1e-12 for t in _TIERS)  # 1e-12: a ratio such as 3/5 is a bound
    rating = max(1, base - invented)
    reason = LABELS[rating - 1]
    if invented:
        reason += f": {invented} invented number{'s' if invented != 1 else ''}"
    return {**out, "rating": rating, "reason": reason}


def rubric_v2_rating(view: JudgeView) -> tuple[int, str]:
    """The rating (1-5) rule ``rubric-v2`` gives one rollout, and its reason."""
    c = rubric_v2_components(view)
    return c["rating"], c["reason"]


__all__ = [
    "PARAMS_V2",
    "RUBRIC_V2",
    "echo_share",
    "new_facts",
    "not_a_summary",
    "rubric_v2_components",
    "rubric_v2_rating",
]
