"""HierR's tool process reward: R_tool = sum of five weighted components, each in [0, 1].

Two variants, both recorded with the run (``reward.variant``, and :data:`RULES` in the recipe).

``paper`` is the public HierR reward (the SLCA-GRPO code's ``reward_fn.py``, "v8.2") on every
response and every ground truth :func:`~slca_exp.rewards.gold.read_gold` accepts, quirks kept (a
ground truth or its ``allowed_tools`` given as a JSON string is decoded first; where the public
code would crash, on numbers beyond a float's range or JSON nested past Python's recursion
limit, the value or block counts as not matching):

- a row whose ``allowed_tools`` is empty scores 0 (every component 0, no penalty) whatever the
  response: the public reward stops there;
- think blocks are removed first (an opening ``<think>``/``<thinking>`` closed by either tag);
- no ``<tool_call>`` tag when the gold has a call: the no-call penalty, every component 0,
  ``should_no_call`` set;
- format: valid blocks / max(#open tags, #close tags); a block is valid when it holds a JSON object
  or array of objects, each with a non-empty string ``name`` the row allows and arguments read as
  ``arguments or parameters or {}`` that are an object (a JSON string is not); calls of invalid
  blocks are dropped;
- name: multiset F1 of predicted vs gold names (both empty: 1; one empty: 0);
- key / value: over gold calls whose ``arguments`` (that key only) are non-empty (none: 1, 1; no
  predictions: 0, 0), each matched greedily in gold order to the unused same-name prediction with
  the highest key + value above 0; values compared by
  :func:`~slca_exp.rewards.match.public_equal`;
- parallel: 1 when the first non-empty gold step has as many calls as the first valid block.

``strict`` fixes defects (a)-(f) of that reward and judges only what the row states:

(a) parallel compares valid call counts per assistant turn (Qwen templates write one tag per
    call): the share of positions i < max(#gold steps, #turns with calls) where step i and turn i
    agree;
(b) calls naming a tool the row does not allow still count as predictions in name F1 (their
    block stays invalid for format);
(c) a gold call that states its arguments (``{}`` included) takes part in key / value, so
    arguments invented where gold says there are none score 0;
(d) on a row that needs no call, writing no ``<tool_call>`` tag earns full credit (every
    component 1), and any tag earns its format credit only (name, key, value, parallel 0): a
    malformed attempt never outscores a well-formed one, and neither reaches the right answer;
(e) (judge failures make the summary absent: ``rewards.summary``, not here);
(f) key / value use an optimal one-to-one assignment instead of greedy gold-order matching.

Not judged: key and value when no gold call states its arguments (bare tool names, as the public
Toucan rows give them), parallel when the gold calls are a flat list (it says which calls, not how
they share turns). Such a component is NaN and the score is the weighted mean of the judged ones
times the total weight, so the exact gold calls still score the full weight. Strict also decodes
arguments given as a JSON string, reads gold arguments given under ``parameters``, ignores calls
echoed inside tool responses, compares values by type
(:func:`~slca_exp.rewards.match.loose_equal`, BFCL-style strings with ``normalize_strings``), and
scores a row that allows no tools like any other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from slca_exp.config.weights import normalized_tool_weights
from slca_exp.rewards.gold import Gold, read_gold
from slca_exp.rewards.match import greedy_match, optimal_match, strict_equal
from slca_exp.rewards.toolcalls import Block, ParsedCalls, parse_tool_calls
from slca_exp.rewards.types import ToolCall

Variant = Literal["paper", "strict"]
VARIANTS: tuple[Variant, ...] = ("paper", "strict")
COMPONENTS = ("format", "name", "key", "value", "parallel")
NO_CALL_PENALTY = -0.5
RULES: dict[Variant, str] = {
    "paper": "the public HierR reward (v8.2) exactly, its defects included",
    "strict": (
        "defects (a)-(f) fixed; key and value judged only against gold calls that state their "
        "arguments, parallel only against gold given as steps; a component not judged is left "
        "out and the judged weights are rescaled to the total weight; any tool call on a row "
        "that needs none earns its format credit only"
    ),
}
"""What each variant scores, in one line: recorded in the recipe's reward component."""


@dataclass(frozen=True)
class HierRWeights:
    """Weights of the five tool process components (the paper's defaults sum to 1)."""

    format: float = 0.10
    name: float = 0.25
    key: float = 0.15
    value: float = 0.20
    parallel: float = 0.30

    @classmethod
    def from_config(cls, weights: Mapping[str, float] | Any) -> HierRWeights:  # noqa: ANN401
        """From ``reward.tool_weights`` (a mapping or an object with the five attributes)."""
        get = weights.get if isinstance(weights, Mapping) else (lambda k: getattr(weights, k))
        return cls(**{k: float(get(k)) for k in COMPONENTS})

    def normalized(self) -> HierRWeights:
        """The same weights rescaled to sum to 1 (:func:`normalized_tool_weights`)."""
        return HierRWeights(**normalized_tool_weights({k: getattr(self, k) for k in COMPONENTS}))


@dataclass(frozen=True)
class ToolReward:
    """The tool process reward of one rollout.

    Attributes:
        score: weighted sum of the judged components (rescaled to the total weight when one is
            not judged), or the no-call penalty.
        components: ``format``, ``name``, ``key``, ``value``, ``parallel``, each in [0, 1], or
            NaN where the strict variant cannot judge it on this row.
        should_no_call: 1 when the task needed a call and the response has no ``<tool_call>``.
        calls: the calls the reward credited (the well-formed ones).
        reasons: rejected ``<tool_call>`` blocks per reason.

    """

    score: float
    components: dict[str, float]
    should_no_call: int = 0
    calls: tuple[ToolCall, ...] = ()
    reasons: dict[str, int] = field(default_factory=dict)


def tool_process_reward(
    response_text: str,
    ground_truth: Mapping[str, Any] | str | Gold,
    weights: HierRWeights = HierRWeights(),  # noqa: B008 - frozen, shared safely
    variant: Variant = "paper",
    *,
    no_call_penalty: float = NO_CALL_PENALTY,
    normalize_strings: bool = False,
) -> ToolReward:
    """Score the tool-call part of a rollout against the row's ground truth.

    Never raises on any response text: malformed calls score 0 with a counted reason.

    Args:
        response_text: the decoded response.
        ground_truth: the row's ``reward_model.ground_truth`` (mapping or JSON string), or a
            :class:`Gold` read once per prompt with :func:`read_gold` (faster for groups).
        weights: the five component weights.
        variant: ``paper`` (the public reward exactly) or ``strict`` (defects fixed, only what
            the row states judged); see the module docstring.
        no_call_penalty: score when a needed call is missing.
        normalize_strings: BFCL-style string comparison (strict variant only).

    Returns:
        :class:`ToolReward`.

    >>> gt = {"allowed_tools": ["get_weather"],
    ...       "gold_tool_calls": [[{"name": "get_weather", "arguments": {"city": "Paris"}}]]}
    >>> text = '<tool_call>{"name": "get_weather", "arguments": {"city": "paris"}}</tool_call>'
    >>> tool_process_reward(text, gt).score
    1.0
    >>> names_only = {"allowed_tools": ["get_weather"], "gold_tool_calls": ["get_weather"]}
    >>> r = tool_process_reward(text, names_only, variant="strict")
    >>> r.score, r.components["key"]
    (1.0, nan)

    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown HierR variant {variant!r}; expected paper or strict")
    gold = read_gold(ground_truth)
    if variant == "paper":
        return _paper(response_text, gold, weights, no_call_penalty)
    return _strict(response_text, gold, weights, no_call_penalty, normalize_strings)


def _paper(text: str, gold: Gold, weights: HierRWeights, penalty: float) -> ToolReward:
    parsed = parse_tool_calls(text, decode_string_arguments=False)
    if not gold.allowed:  # the public reward returns 0 before it reads the response
        return ToolReward(0.0, dict.fromkeys(COMPONENTS, 0.0), 0, (), parsed.reasons)
    if parsed.open_tags == 0 and gold.needs_call:
        return _no_call(penalty, parsed)
    valid = [b for b in parsed.blocks if b.error is None and _allowed(b, gold)]
    calls = [call for block in valid for call in block.calls]
    golds = gold.argued_calls
    if not golds:
        key, value = 1.0, 1.0
    elif not calls:
        key, value = 0.0, 0.0
    else:
        key, value = _means(greedy_match(golds, calls), len(golds))
    want = len(gold.steps[0]) if gold.steps else 0
    got = len(valid[0].calls) if valid else 0
    comps = {
        "format": _format(parsed, valid),
        "name": _name_f1([c.name for c in calls], [c.name for c in gold.calls]),
        "key": key,
        "value": value,
        "parallel": 1.0 if want == got else 0.0,
    }
    return ToolReward(_weighted(comps, weights), comps, 0, tuple(calls), parsed.reasons)


def _strict(
    text: str, gold: Gold, weights: HierRWeights, penalty: float, normalize_strings: bool
) -> ToolReward:
    parsed = parse_tool_calls(text, skip_tool_responses=True)
    valid = [b for b in parsed.blocks if b.error is None and _allowed(b, gold)]
    calls = tuple(call for block in valid for call in block.calls)
    if not gold.needs_call:  # (d)
        if parsed.open_tags == parsed.close_tags == 0:
            comps = dict.fromkeys(COMPONENTS, 1.0)
        else:  # a call where none is due: only how well it is written earns anything
            comps = dict.fromkeys(COMPONENTS, 0.0) | {"format": _format(parsed, valid)}
        return ToolReward(_weighted(comps, weights), comps, 0, calls, parsed.reasons)
    if parsed.open_tags == 0:
        return _no_call(penalty, parsed)
    # (b): every well-formed call counts against name precision, allowed or not.
    named = [call.name for block in parsed.blocks if block.error is None for call in block.calls]
    golds = gold.stated_calls  # (c)
    if not golds:  # names-only gold: nothing to judge the arguments against
        key, value = math.nan, math.nan
    elif not calls:
        key, value = 0.0, 0.0
    else:  # (f)
        equal = strict_equal(normalize_strings)
        key, value = _means(optimal_match(golds, calls, equal=equal), len(golds))
    comps = {
        "format": _format(parsed, valid),
        "name": _name_f1(named, [c.name for c in gold.calls]),
        "key": key,
        "value": value,
        "parallel": _parallel_turns(valid, gold) if gold.stepped else math.nan,  # (a)
    }
    return ToolReward(_weighted(comps, weights), comps, 0, calls, parsed.reasons)


def reweighted(reward: ToolReward, weights: HierRWeights) -> ToolReward:
    """``reward`` scored under ``weights``: the same components, calls and no-call penalty.

    What :func:`tool_process_reward` gives the same rollout under ``weights``, without parsing
    it again: every score but the penalty is the weighted components.
    """
    if reward.should_no_call:
        return reward
    return replace(reward, score=_weighted(reward.components, weights))


def _no_call(penalty: float, parsed: ParsedCalls) -> ToolReward:
    return ToolReward(float(penalty), dict.fromkeys(COMPONENTS, 0.0), 1, (), parsed.reasons)


def _allowed(block: Block, gold: Gold) -> bool:
    return all(call.name in gold.allowed for call in block.calls)


def _format(parsed: ParsedCalls, valid: list[Block]) -> float:
    denom = max(parsed.open_tags, parsed.close_tags)
    return len(valid) / denom if denom else 0.0


def _means(scores: list[tuple[float, float]], n: int) -> tuple[float, float]:
    return sum(k for k, _ in scores) / n, sum(v for _, v in scores) / n


def _name_f1(pred: list[str], gold: list[str]) -> float:
    if not pred and not gold:
        return 1.0
    if not pred or not gold:
        return 0.0
    counts: dict[str, int] = {}
    for name in gold:
        counts[name] = counts.get(name, 0) + 1
    overlap = 0
    for name in pred:
        if counts.get(name, 0) > 0:
            counts[name] -= 1
            overlap += 1
    return 2.0 * overlap / (len(pred) + len(gold))


def _parallel_turns(valid: list[Block], gold: Gold) -> float:
    """(a): valid calls per assistant turn against gold calls per step, position by position."""
    want = [len(step) for step in gold.steps]
    per_turn: dict[int, int] = {}
    for block in valid:
        if block.calls:
            per_turn[block.turn] = per_turn.get(block.turn, 0) + len(block.calls)
    got = list(per_turn.values())
    n = max(len(want), len(got))
    if n == 0:
        return 1.0
    want += [0] * (n - len(want))
    got += [0] * (n - len(got))
    return sum(a == b for a, b in zip(want, got, strict=True)) / n


def _weighted(components: Mapping[str, float], weights: HierRWeights) -> float:
    """The weighted sum of the components, rescaled when some are left out.

    With components left out (NaN): the judged ones' weighted mean times the total weight (their
    plain mean when the judged ones weigh nothing).
    """
    judged = [k for k in COMPONENTS if not math.isnan(components[k])]
    score = sum(getattr(weights, k) * components[k] for k in judged)
    if len(judged) == len(COMPONENTS):
        return score
    total = sum(getattr(weights, k) for k in COMPONENTS)
    mass = sum(getattr(weights, k) for k in judged)
    if mass > 0:
        return total * (score / mass)
    return total * sum(components[k] for k in judged) / len(judged)
