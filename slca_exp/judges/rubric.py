"""Rule ``rubric-v1`` of the rubric judge, and how the rubric judge reads texts.

The rubric judge (:mod:`slca_exp.judges.rubric_judge`) is a deterministic, model-free stand-in
for the paper's frozen LLM judge. ``judge.rubric_version=v1`` picks this rule, kept so that runs
made with it reproduce; new runs use ``rubric-v2`` (:mod:`slca_exp.judges.rubric_v2`), which
reads texts the same way (rules 1-3 below) but rates a reply on what it states.

The rule, applied after the same short-circuits as the LLM judge:

1. Tokens. Text is cut into number tokens (digits with ``.``/``,`` separators; ``1,234`` is 1234,
   ``3,5`` is 3.5, a token with two or more dots such as an IP address is a word) and word tokens
   (runs of letters, lower-cased). Signs are ignored. Only the first 100,000 characters of each
   text are analysed (the length factor uses the full reply).
2. Facts of the tool responses. A response that parses as JSON contributes its scalar leaves:
   every finite number; every string of at most 6 key words is one phrase fact; a longer string
   contributes its numbers and its key words. Object keys, booleans and nulls are not facts. A
   response that is not JSON contributes its numbers and key words. A key word has at least 4
   letters and is not a stop word; a phrase keeps words of at least 2 letters that are not stop
   words. The first 64 distinct facts in document order count.
3. A reply number with ``d`` decimals (``d`` at most 6) *matches* a source number ``v`` when
   ``f"{abs(v):.{d}f}"`` equals it: "21" and "21.4" both match 21.37. A number fact is *covered*
   when some reply number matches it; a phrase fact when all its words occur in the reply.
4. Coverage ``C = min(1, covered / min(F, 5))`` over the ``F`` facts (1 when ``F = 0``): reporting
   five facts of a large response is complete.
5. Faithfulness ``P = grounded / (grounded + invented)`` (1 when the reply has no numbers): a
   reply number is grounded when it matches a number of the tool responses or of the question;
   otherwise it is invented, except integers from 0 to 10 (list markers, counts), which are
   ignored.
6. Length ``L``: 1 for replies of 40 to 4,000 characters, ``n / 40`` below, ``4000 / n`` above.
7. Repetition ``D = 1 - distinct / total`` over the reply's token trigrams when it has at least 4
   of them, else 0.
8. ``s = (0.4 C + 0.4 P + 0.2 L) * (1 - D)``; rating ``1 + min(4, floor(5 s))``: below 0.2 very
   poor, 0.2 poor, 0.4 acceptable, 0.6 good, 0.8 and above excellent.

Pure Python: one JSON decode per response, one linear (non-backtracking) regex scan per text and
set lookups; thousands of rollouts per second.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

from slca_exp.judges.base import JudgeView

RUBRIC_V1 = "rubric-v1"

PARAMS: dict[str, Any] = {
    "weights": {"coverage": 0.4, "faithfulness": 0.4, "length": 0.2},
    "full_coverage_facts": 5,
    "max_facts": 64,
    "phrase_words": 6,
    "key_word_letters": 4,
    "ignored_small_int": 10,
    "good_chars": [40, 4000],
    "max_decimals": 6,
    "analysed_chars": 100_000,
}
"""The rule's constants; their hash is recorded as the judge's ``prompt_sha256``."""

RULE_V1 = {"rubric": RUBRIC_V1, "params": PARAMS}
"""What the judge records of rule v1 (its hash is ``prompt_sha256``)."""

# Digits with single separators between digit groups (unambiguous, so linear), or letters.
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+")

STOP_WORDS = frozenset(
    # A plain word list reads better than 76 quoted strings.
    (  # noqa: SIM905
        "a an and are as at be been but by can could did do does for from had has have how i if in "
        "into is it its me my no not of on or our so than that the their them then there these "
        "they this those to too was we were what when where which while who why will with would "
        "you your about also just more most some such only other over here"
    ).split()
)

_W, _F = PARAMS["weights"], PARAMS["full_coverage_facts"]
_MIN_CHARS, _MAX_CHARS = PARAMS["good_chars"]
_CUT = PARAMS["analysed_chars"]
_DECIMALS = PARAMS["max_decimals"]


def _number(token: str) -> tuple[int, float] | None:
    """``(decimals, value)`` of a number token, or ``None`` when it reads as a word."""
    if token.count(".") > 1:
        return None
    if "," in token:
        groups = token.split(",")
        if all(len(g) == 3 for g in groups[1:]) and "." not in groups[0]:
            token = "".join(groups)  # thousands separators
        elif token.count(",") == 1 and "." not in token:
            token = token.replace(",", ".")  # decimal comma
        else:
            return None
    decimals = len(token) - token.index(".") - 1 if "." in token else 0
    value = float(token)
    return (min(decimals, _DECIMALS), value) if math.isfinite(value) else None


def _forms(value: float) -> set[tuple[int, str]]:
    """Every ``(d, rounded text)`` a reply could write ``value`` as."""
    try:
        v = abs(float(value))
    except OverflowError:
        return set()
    if not math.isfinite(v):
        return set()
    return {(d, f"{v:.{d}f}") for d in range(_DECIMALS + 1)}


class _Text:
    """Tokens of one text: numbers as ``(d, rounded text)``, words, all tokens in order."""

    __slots__ = ("numbers", "tokens", "words")

    def __init__(self, text: str) -> None:
        self.tokens: list[str] = _TOKEN.findall(text[:_CUT].lower())
        self.numbers: list[tuple[int, str, float]] = []
        words = []
        for token in self.tokens:
            if token[0].isdigit():
                parsed = _number(token)
                if parsed is not None:
                    d, v = parsed
                    self.numbers.append((d, f"{abs(v):.{d}f}", v))
                    continue
            words.append(token)
        self.words = set(words)


_LETTER_DIGIT = re.compile(r"[^\W\d_]\d")
_SNAKE = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)+")


def is_identifier(text: str) -> bool:
    """Whether a response string is an identifier, not a fact (``rubric-v2``'s rule 2).

    One token (no whitespace) with a letter followed by a digit (``res-d40715``, ``AF123``, a
    UUID), or snake_case (``get_time``).

    >>> [is_identifier(s) for s in ("res-d40715", "get_time", "Asia/Tokyo", "72°F", "light rain")]
    [True, True, False, False, False]

    """
    s = text.strip()
    if not s or any(ch.isspace() for ch in s):
        return False
    return bool(_LETTER_DIGIT.search(s)) or bool(_SNAKE.fullmatch(s))


def _key_words(tokens: Iterable[str]) -> list[str]:
    limit = PARAMS["key_word_letters"]
    return [t for t in tokens if t.isalpha() and len(t) >= limit and t not in STOP_WORDS]


def _leaves(doc: Any) -> list[Any]:  # noqa: ANN401
    """Scalar leaves of a decoded JSON document in document order (iterative: any depth)."""
    out: list[Any] = []
    stack = [doc]
    while stack and len(out) < 4 * PARAMS["max_facts"]:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))
        elif not isinstance(node, bool) and isinstance(node, str | int | float):
            out.append(node)
    return out


def _facts(response: str) -> list[tuple[float | tuple[str, ...], bool]]:
    """Facts of one tool response, in document order, each with whether it is an identifier's.

    A fact is a number or a phrase (a tuple of words); the flag says it comes from a JSON string
    ``rubric-v2`` reads as an identifier.
    """
    stripped = response.strip()
    leaves: list[Any] | None = None
    if stripped[:1] in ("{", "[") and len(stripped) <= _CUT:
        try:
            leaves = _leaves(json.loads(stripped))
        except (ValueError, RecursionError):
            leaves = None  # not JSON (or absurdly deep): read it as text
    is_json = leaves is not None
    facts: list[tuple[float | tuple[str, ...], bool]] = []
    for leaf in leaves if is_json else [stripped]:
        if not isinstance(leaf, str):
            if not (isinstance(leaf, float) and not math.isfinite(leaf)):
                facts.append((leaf, False))
            continue
        ident = is_json and is_identifier(leaf)
        text = _Text(leaf)
        facts.extend((v, ident) for _, _, v in text.numbers)
        phrase = [t for t in text.tokens if t.isalpha() and len(t) >= 2 and t not in STOP_WORDS]
        if is_json and 0 < len(phrase) <= PARAMS["phrase_words"]:
            facts.append((tuple(phrase), ident))
        else:
            facts.extend(((w,), ident) for w in _key_words(text.tokens))
    return facts


Fact = float | tuple[str, ...]
"""A fact of a tool response (rule 2): a number, or a phrase as a tuple of words."""


def response_facts(response: str, *, identifiers: bool = True) -> list[Fact]:
    """The facts of one tool response (rule 2), in document order, repeats included.

    ``identifiers=False``: without the JSON strings ``rubric-v2`` reads as identifiers.

    >>> response_facts('{"city": "Paris", "temp_c": 21.4, "ok": true}')
    [('paris',), 21.4]

    """
    return [fact for fact, ident in _facts(response) if identifiers or not ident]


def read_response(response: str) -> tuple[list[Fact], set[tuple[int, str]]]:
    """A tool response read once for ``rubric-v2``: its facts and its numbers' forms.

    The facts leave identifiers out (document order, repeats included); the forms are every
    ``(d, rounded text)`` of every number in it, identifiers' included (what grounds a reply).
    """
    facts, forms, numbers = [], set(), set()
    for fact, ident in _facts(response):
        if not isinstance(fact, tuple) and fact not in numbers:
            numbers.add(fact)
            forms |= _forms(fact)
        if not ident:
            facts.append(fact)
    return facts, forms


class Statement:
    """What a text states, as rule 3 reads it: its numbers (at the decimals written) and words.

    >>> said = Statement("It is 21 degrees in Paris.")
    >>> said.states(21.37), said.states(("paris",)), said.states(22.0)
    (True, True, False)

    """

    __slots__ = ("forms", "numbers", "tokens", "words")

    def __init__(self, text: str) -> None:
        parsed = _Text(text)
        self.numbers = parsed.numbers
        self.tokens = parsed.tokens
        self.forms = {(d, s) for d, s, _ in parsed.numbers}
        self.words = parsed.words

    def repetition(self) -> float:
        """Rule 7's ``D``: ``1 - distinct / total`` token trigrams (0 below 4 trigrams)."""
        return _repetition(self.tokens)

    def states(self, fact: Fact) -> bool:
        """Whether the text states ``fact``: a number written to any precision, or every word."""
        if isinstance(fact, tuple):
            return all(w in self.words for w in fact)
        return not self.forms.isdisjoint(_forms(fact))


def rubric_components(view: JudgeView) -> dict[str, float]:
    """The rule's components for one rollout: coverage, faithfulness, length, repetition, s.

    Example:
        >>> v = JudgeView("Weather in Paris?", ('{"city": "Paris", "temp_c": 21.4}',),
        ...               "It is 21.4 degrees in Paris right now.")
        >>> c = rubric_components(v)
        >>> c["coverage"], c["faithfulness"], c["length"], c["s"]
        (1.0, 1.0, 0.95, 0.99)

    """
    reply = _Text(view.reply)
    facts: dict[Any, None] = {}
    sources: set[tuple[int, str]] = set()
    for response in view.tool_responses:
        for fact, _ in _facts(response):
            if not isinstance(fact, tuple) and fact not in facts:
                sources |= _forms(fact)  # every number grounds, even past the fact cap
            facts.setdefault(fact, None)
    for _, _, v in _Text(view.question).numbers:
        sources |= _forms(v)
    picked = list(facts)[: PARAMS["max_facts"]]

    reply_forms = {(d, s) for d, s, _ in reply.numbers}
    covered = 0
    for fact in picked:
        if isinstance(fact, tuple):
            covered += all(w in reply.words for w in fact)
        else:
            covered += not reply_forms.isdisjoint(_forms(fact))
    coverage = min(1.0, covered / min(len(picked), _F)) if picked else 1.0

    grounded = invented = 0
    for d, s, v in reply.numbers:
        if (d, s) in sources:
            grounded += 1
        elif not (d == 0 and abs(v) <= PARAMS["ignored_small_int"]):
            invented += 1
    faithfulness = grounded / (grounded + invented) if grounded + invented else 1.0

    n = len(view.reply)
    length = n / _MIN_CHARS if n < _MIN_CHARS else (_MAX_CHARS / n if n > _MAX_CHARS else 1.0)

    repetition = _repetition(reply.tokens)

    s = (_W["coverage"] * coverage + _W["faithfulness"] * faithfulness + _W["length"] * length) * (
        1.0 - repetition
    )
    return {
        "coverage": coverage,
        "faithfulness": faithfulness,
        "length": length,
        "repetition": repetition,
        "facts": float(len(picked)),
        "invented": float(invented),
        "s": round(s, 12),
    }


def _repetition(tokens: list[str]) -> float:
    trigrams = list(zip(tokens, tokens[1:], tokens[2:], strict=False))
    return 1.0 - len(set(trigrams)) / len(trigrams) if len(trigrams) >= 4 else 0.0


def rubric_rating(view: JudgeView) -> int:
    """The rubric rating (1-5) of one rollout."""
    s = rubric_components(view)["s"]
    return 1 + min(4, math.floor(5.0 * s + 1e-9))
