"""HierR's tool process reward: R_tool = sum of five weighted components, each in [0, 1].

Two variants, both recorded with the run (``reward.variant``):

``paper`` reproduces the public reward (REFERENCE.md §2) exactly:

- format: valid blocks / max(#open tags, #close tags); a block is valid when it parses and every
  call names an allowed tool; 0 without tags. Calls of invalid blocks are dropped.
- name: multiset F1 of predicted vs gold names (both empty: 1; one empty: 0).
- key / value: over gold calls with arguments (none: 1, 1; no predictions: 0, 0), each matched
  greedily in gold order to the unused same-name prediction maximising key + value.
- parallel: 1 when the first gold step has as many calls as the first valid block.
- no call at all when the task needs one: score = the no-call penalty, every component 0,
  ``should_no_call`` set.

``strict`` fixes defects (a)-(f) and nothing else:

(a) parallel compares valid call counts per assistant turn (Qwen templates write one tag per
    call): the share of positions i < max(#gold steps, #turns with calls) where step i and turn i
    agree;
(b) calls naming a tool the row does not allow still count as predictions in name F1 (their
    block stays invalid for format);
(c) gold calls without arguments take part in key / value, so invented arguments score 0 (and a
    call on a row whose gold has no call at all scores key = value = 0, not 1);
(d) not calling on a row that needs no call earns full credit (every component 1);
(e) (judge failures make the summary absent: ``rewards.summary``, not here);
(f) key / value use an optimal one-to-one assignment instead of greedy gold-order matching.
With ``normalize_strings`` string values are also compared BFCL-style.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from slca_exp.rewards.gold import Gold, read_gold
from slca_exp.rewards.match import greedy_match, optimal_match
from slca_exp.rewards.toolcalls import ParsedCalls, parse_tool_calls
from slca_exp.rewards.types import ToolCall

Variant = Literal["paper", "strict"]
VARIANTS: tuple[Variant, ...] = ("paper", "strict")
COMPONENTS = ("format", "name", "key", "value", "parallel")
NO_CALL_PENALTY = -0.5


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
        """The same weights rescaled to sum to 1."""
        total = sum(getattr(self, k) for k in COMPONENTS)
        if not total > 0:
            raise ValueError("cannot normalise tool weights that sum to 0")
        return HierRWeights(**{k: getattr(self, k) / total for k in COMPONENTS})


@dataclass(frozen=True)
class ToolReward:
    """The tool process reward of one rollout.

    Attributes:
        score: weighted sum of the components, or the no-call penalty.
        components: ``format``, ``name``, ``key``, ``value``, ``parallel``, each in [0, 1].
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
        variant: ``paper`` (exact parity) or ``strict`` (defects (a)-(f) fixed).
        no_call_penalty: score when a needed call is missing.
        normalize_strings: BFCL-style string comparison (strict variant only).

    Returns:
        :class:`ToolReward`.

    >>> gt = {"allowed_tools": ["get_weather"],
    ...       "gold_tool_calls": [[{"name": "get_weather", "arguments": {"city": "Paris"}}]]}
    >>> text = '<tool_call>{"name": "get_weather", "arguments": {"city": "paris"}}</tool_call>'
    >>> tool_process_reward(text, gt).score
    1.0

    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown HierR variant {variant!r}; expected paper or strict")
    gold = read_gold(ground_truth)
    strict = variant == "strict"
    parsed = parse_tool_calls(response_text, skip_tool_responses=strict)
    if parsed.open_tags == 0 and gold.needs_call:
        zero = dict.fromkeys(COMPONENTS, 0.0)
        return ToolReward(float(no_call_penalty), zero, 1, (), parsed.reasons)
    if strict and gold.needs_call is False and parsed.open_tags == parsed.close_tags == 0:
        full = dict.fromkeys(COMPONENTS, 1.0)
        return ToolReward(_weighted(full, weights), full, 0, (), parsed.reasons)  # (d)
    valid, named = _credited(parsed, gold, strict)
    denom = max(parsed.open_tags, parsed.close_tags)
    comps = {
        "format": len(valid) / denom if denom else 0.0,
        "name": _name_f1([c.name for c in named], [c.name for c in gold.calls]),
    }
    comps["key"], comps["value"] = _key_value(valid, gold, strict, normalize_strings and strict)
    comps["parallel"] = _parallel_turns(valid, gold) if strict else _parallel_first(valid, gold)
    calls = tuple(c for block in valid for c in block.calls)
    return ToolReward(_weighted(comps, weights), comps, 0, calls, parsed.reasons)


def _credited(parsed: ParsedCalls, gold: Gold, strict: bool) -> tuple[list, list[ToolCall]]:
    """Format-valid blocks, and the calls name F1 counts (strict: hallucinated names too)."""
    valid, named = [], []
    for block in parsed.blocks:
        if block.error is not None:
            continue
        if all(call.name in gold.allowed for call in block.calls):
            valid.append(block)
            named.extend(block.calls)
        elif strict:
            named.extend(block.calls)  # (b)
    return valid, named


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


def _key_value(valid: list, gold: Gold, strict: bool, bfcl: bool) -> tuple[float, float]:
    preds = [call for block in valid for call in block.calls]
    # (c): strict keeps gold calls without arguments, so invented arguments cost key and value.
    golds = gold.calls if strict else [c for c in gold.calls if c.arguments]
    if not golds:
        if strict and preds:  # a call where gold has none: nothing to credit
            return 0.0, 0.0
        return 1.0, 1.0
    if not preds:
        return 0.0, 0.0
    match = optimal_match if strict else greedy_match  # (f)
    scores = match(golds, preds, normalize_strings=bfcl)
    return sum(k for k, _ in scores) / len(golds), sum(v for _, v in scores) / len(golds)


def _parallel_first(valid: list, gold: Gold) -> float:
    want = len(gold.steps[0]) if gold.steps else 0
    got = len(valid[0].calls) if valid else 0
    return 1.0 if want == got else 0.0


def _parallel_turns(valid: list, gold: Gold) -> float:
    """(a): valid calls per assistant turn against gold calls per step, position by position."""
    want = [len(step) for step in gold.steps if step]
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
    return sum(getattr(weights, k) * components[k] for k in COMPONENTS)
