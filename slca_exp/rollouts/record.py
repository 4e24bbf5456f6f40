"""A sampled rollout as a plain record: what both engines hand to the rollout renderers.

    engine (local: its rollout batch; verl: the batch its actor receives, or its validation)
      -> build_record(tokens, mask, segments, advantages, log-probs, rewards, answers, ...)
      -> RolloutRecord   (plain data: no MLflow, no W&B; JSON in and out)
      -> tracking/       traces, tables, the HTML credit view, the ``rollouts`` command

A record holds the rollout token by token (id, text, segment, advantage, log-prob), its turns
(assistant turns with their segment; the environment's tool turns), its tool calls with the
simulator's answers, its reward parts and its two segment advantages. Segments are read off the
estimator's split (``engine.rl.mask_rule`` included): ``tool``, ``summary``, ``env`` (injected
tokens under mask 0) or ``none`` (a learnable token in neither segment).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slca_exp.rollouts.drift import TokenDrift

SEGMENT_CODES = {"tool": "t", "summary": "s", "env": "e", "none": "-"}
"""Per-token segment, one character each in ``RolloutRecord.segments``."""
CODE_SEGMENTS = {code: name for name, code in SEGMENT_CODES.items()}
SPLITS = ("train", "val")

_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)


@dataclass
class Answer:
    """The simulator's answer to one tool call, as the engine saw it.

    Attributes:
        content: what the policy read inside ``<tool_response>``.
        status: ``ok`` | ``schema_error`` | ``failed``; None where the engine does not know.
        reason: how it was produced or why it failed.
        cached: answered from the simulator's cache; None where unknown.

    """

    content: str
    status: str | None = None
    reason: str = ""
    cached: bool | None = None


@dataclass
class Call:
    """One tool call of an assistant turn and the answer that followed it.

    Attributes:
        turn: index of the assistant turn that made it (0-based).
        name: the tool's name.
        arguments: the arguments as parsed.
        answer: the answer, or None when no tool turn followed (a cut-off rollout).

    """

    turn: int
    name: str
    arguments: dict[str, Any]
    answer: Answer | None = None


@dataclass
class Turn:
    """A contiguous stretch of the response.

    Attributes:
        role: ``assistant`` (generated, learnable) or ``tool`` (injected by the environment).
        start: first token (index into the response).
        end: one past the last token.
        segment: ``tool`` | ``summary`` | ``env`` (the segment most of its tokens belong to).
        text: its decoded text.

    """

    role: str
    start: int
    end: int
    segment: str
    text: str

    @property
    def tokens(self) -> int:
        """Number of tokens."""
        return self.end - self.start


@dataclass
class Rewards:
    """The reward parts of one rollout.

    Attributes:
        tool: R_tool before routing: the HierR tool process score, or under
            ``reward.tool_reward=outcome`` the outcome verdict's score (NaN: the judge failed).
        components: ``format``, ``name``, ``key``, ``value``, ``parallel``.
        summary: the summary score, (rating - 1) / 4; NaN when the judge could not score it.
        rating: the judge's 1-5 rating, or None.
        judge_status: ``ok`` | ``short_circuit`` | ``failed``.
        judge_reason: why the judge short-circuited or failed ("" when ok).
        should_no_call: the row needed a call and the rollout made none (the penalty is its total).
        routed_tool: the tool score the estimator received (after penalty routing).
        routed_summary: the summary score the estimator received.
        total: the routed total (``process_weight * R_tool + summary_weight * R_sum``, or the
            no-call penalty).
        raw_rating: the judge's own rating where ``judge.noise`` perturbed it (``rating`` and
            ``summary`` are then the perturbed ones); else the same as ``rating``.
        hierr: the HierR tool process score where it is not R_tool (logged only): under
            ``reward.tool_reward=outcome``, or weighed by ``reward.logged_weights``; else ``None``
            (it is ``tool`` then).
        outcome: the outcome judge's verdict (``Solved``, ``Unsolved``, ``Unsure``), or ``None``
            (not asked, failed, or ``reward.tool_reward=hierr``).

    """

    tool: float
    components: dict[str, float]
    summary: float
    rating: int | None
    judge_status: str
    judge_reason: str
    should_no_call: bool
    routed_tool: float
    routed_summary: float
    total: float
    raw_rating: int | None = None
    hierr: float | None = None
    outcome: str | None = None


@dataclass
class RolloutRecord:
    """One sampled rollout, ready to render (see the module docstring).

    Attributes:
        run: ``algorithm``, ``seed`` and ``engine`` of the run that sampled it.
        step: the RL step (0: before the first update).
        split: ``train`` or ``val``.
        group: the prompt's id (``<split>-<row index>``): the rollouts of one GRPO group.
        sample: the rollout's index within its group.
        rank: ``best``, ``worst`` or ``""``: why it was picked from its group.
        prompt: the prompt's messages.
        tools: the tool schemas the prompt lists.
        gold: the gold calls (``[{"name", "arguments"}]``).
        response: the decoded response, special tokens kept.
        token_ids: the response's token ids.
        token_text: each token decoded on its own.
        segments: one character per token (:data:`SEGMENT_CODES`).
        advantages: per token, the advantage the update used (None off the response mask, and
            everywhere on validation rollouts, which no update uses).
        logprobs: per token, the log-prob the policy sampled it with (None where unknown).
        turns: the response's stretches, in order.
        calls: every tool call, in order.
        rewards: the reward parts.
        tool_adv: the tool segment's advantage (None: no tool segment, or validation).
        summary_adv: the summary segment's advantage (None: no summary segment, or validation).
        ends_on_tool_call: the last assistant turn is a call nothing answered (cut off).
        drift: how the token ids differ from the chat template's rendering of the rollout's
            conversation (``rollouts.drift``); None where it was not checked.

    """

    run: dict[str, Any]
    step: int
    split: str
    group: str
    sample: int
    rank: str
    prompt: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    gold: list[dict[str, Any]]
    response: str
    token_ids: list[int]
    token_text: list[str]
    segments: str
    advantages: list[float | None]
    logprobs: list[float | None]
    turns: list[Turn]
    calls: list[Call]
    rewards: Rewards
    tool_adv: float | None
    summary_adv: float | None
    ends_on_tool_call: bool
    extra: dict[str, Any] = field(default_factory=dict)
    drift: TokenDrift | None = None

    def segment_tokens(self, segment: str) -> int:
        """Number of tokens of ``segment`` (``tool``, ``summary``, ``env``)."""
        return self.segments.count(SEGMENT_CODES[segment])

    @property
    def summary_text(self) -> str:
        """The last assistant turn's text ("" when the rollout has none)."""
        last = [t for t in self.turns if t.role == "assistant"]
        return last[-1].text if last else ""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (NaN and infinities as None)."""
        return _json_ready(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutRecord:
        """The record :meth:`to_dict` wrote."""
        values = dict(data)
        values["turns"] = [Turn(**t) for t in values["turns"]]
        values["calls"] = [
            Call(**{**c, "answer": Answer(**c["answer"]) if c.get("answer") else None})
            for c in values["calls"]
        ]
        rewards = dict(values["rewards"])
        for key in ("tool", "summary", "routed_tool", "routed_summary", "total"):
            rewards[key] = math.nan if rewards[key] is None else float(rewards[key])
        values["rewards"] = Rewards(**rewards)
        if values.get("drift") is not None:
            values["drift"] = TokenDrift(**values["drift"])
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)


def build_record(
    *,
    token_ids: Sequence[int],
    decode: Callable[[list[int]], str],
    response_mask: Sequence[int],
    tool_mask: Sequence[bool],
    summary_mask: Sequence[bool],
    advantages: Sequence[float] | None,
    logprobs: Sequence[float] | None,
    rewards: Rewards,
    answers: Sequence[Answer | Mapping[str, Any]] | None,
    run: Mapping[str, Any],
    step: int,
    split: str,
    group: str,
    sample: int,
    prompt: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    gold: Sequence[Mapping[str, Any]],
    tool_adv: float | None,
    summary_adv: float | None,
    ends_on_tool_call: bool,
    rank: str = "",
) -> RolloutRecord:
    """A record from one rollout's response, read token by token.

    Args:
        token_ids: the response's T token ids (no padding).
        decode: the tokenizer's decoding, special tokens kept (``ids -> text``): each token is
            decoded on its own for the credit view, each turn and the response as a whole.
        response_mask: (T,) 1 on generated tokens, 0 on injected ones.
        tool_mask: (T,) the estimator's tool segment.
        summary_mask: (T,) the estimator's summary segment.
        advantages: (T,) the token advantages the update used; None for validation.
        logprobs: (T,) the sampling log-probs (NaN or None where unknown); None: unknown.
        rewards: the reward parts.
        answers: the simulator's answers in call order (``Answer`` or its fields), or None when
            the engine only has what the response text shows; a tool turn's
            ``<tool_response>`` blocks give the content either way.
        run: ``algorithm``, ``seed``, ``engine``.
        step: the RL step.
        split: ``train`` | ``val``.
        group: the prompt id.
        sample: index within the group.
        prompt: the prompt's messages.
        tools: the prompt's tool schemas.
        gold: the gold calls.
        tool_adv: the tool segment's advantage, None without one.
        summary_adv: the summary segment's advantage, None without one.
        ends_on_tool_call: cut off on an unanswered call.
        rank: why it was picked (``best`` / ``worst``).

    Raises:
        ValueError: the per-token sequences differ in length, or ``split`` is unknown.

    """
    ids = [int(t) for t in token_ids]
    n = len(ids)
    for name, seq in (
        ("response_mask", response_mask),
        ("tool_mask", tool_mask),
        ("summary_mask", summary_mask),
        ("advantages", advantages),
        ("logprobs", logprobs),
    ):
        if seq is not None and len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries for {n} response tokens")
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: use one of {', '.join(SPLITS)}")
    token_text = [decode([t]) for t in ids]
    codes = "".join(
        SEGMENT_CODES[_segment(bool(m), bool(t), bool(s))]
        for m, t, s in zip(response_mask, tool_mask, summary_mask, strict=True)
    )
    turns = _turns(codes, ids, decode)
    learnable = [bool(m) for m in response_mask]
    adv = (
        [finite_or_none(a) if on else None for a, on in zip(advantages, learnable, strict=True)]
        if advantages is not None
        else [None] * n
    )
    lps = (
        [finite_or_none(lp) if on else None for lp, on in zip(logprobs, learnable, strict=True)]
        if logprobs is not None
        else [None] * n
    )
    return RolloutRecord(
        run=dict(run),
        step=int(step),
        split=split,
        group=str(group),
        sample=int(sample),
        rank=rank,
        prompt=[dict(m) for m in prompt],
        tools=[dict(t) for t in tools],
        gold=[dict(g) for g in gold],
        response=decode(ids),
        token_ids=ids,
        token_text=token_text,
        segments=codes,
        advantages=adv,
        logprobs=lps,
        turns=turns,
        calls=_calls(turns, answers),
        rewards=rewards,
        tool_adv=finite_or_none(tool_adv),
        summary_adv=finite_or_none(summary_adv),
        ends_on_tool_call=bool(ends_on_tool_call),
    )


def prompt_id(row: Mapping[str, Any], split: str) -> str:
    """``<split>-<row index>``: a prompt's id, the same on both engines."""
    extra = row.get("extra_info") if isinstance(row, Mapping) else None
    index = extra.get("index") if isinstance(extra, Mapping) else None
    if index is None:
        return f"{split}-?"
    return f"{split}-{int(index)}"


def _segment(learnable: bool, tool: bool, summary: bool) -> str:
    if not learnable:
        return "env"
    if summary:
        return "summary"
    return "tool" if tool else "none"


def _turns(codes: str, ids: Sequence[int], decode: Callable[[list[int]], str]) -> list[Turn]:
    """The response's stretches: runs of generated tokens, runs of injected ones.

    A run of generated tokens is one assistant turn (its segment is the one most of its tokens
    are in: a turn never straddles the boundary, but a ``none`` token could sit in one).
    """
    turns: list[Turn] = []
    start = 0
    if not codes:
        return turns
    for k in range(1, len(codes) + 1):
        if k < len(codes) and (codes[k] == "e") == (codes[start] == "e"):
            continue
        run = codes[start:k]
        role = "tool" if run[0] == "e" else "assistant"
        if role == "tool":
            segment = "env"
        else:
            counts = {c: run.count(c) for c in set(run)}
            segment = CODE_SEGMENTS[max(sorted(counts), key=counts.__getitem__)]
        turns.append(Turn(role, start, k, segment, decode(list(ids[start:k]))))
        start = k
    return turns


def _calls(
    turns: Sequence[Turn], answers: Sequence[Answer | Mapping[str, Any]] | None
) -> list[Call]:
    """Each assistant turn's calls, paired in order with the next tool turn's responses.

    ``answers`` (the engine's, in call order) fill in status, reason and cache hit; where the
    engine has none, the response text gives the content.
    """
    from slca_exp.rewards.toolcalls import parse_tool_calls

    given = [a if isinstance(a, Answer) else Answer(**dict(a)) for a in answers or ()]
    calls: list[Call] = []
    assistant = -1
    for k, turn in enumerate(turns):
        if turn.role != "assistant":
            continue
        assistant += 1
        parsed = parse_tool_calls(turn.text).calls
        if not parsed:
            continue
        after = turns[k + 1] if k + 1 < len(turns) and turns[k + 1].role == "tool" else None
        shown = _RESPONSE.findall(after.text) if after is not None else []
        for j, call in enumerate(parsed):
            answer = None
            if after is not None:
                answer = given.pop(0) if given else Answer(shown[j] if j < len(shown) else "")
            calls.append(Call(assistant, call.name, dict(call.arguments), answer))
    return calls


def finite_or_none(value: Any) -> float | None:  # noqa: ANN401
    """``value`` as a float, or ``None`` when it is missing or not finite (JSON has no NaN)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _json_ready(value: Any) -> Any:  # noqa: ANN401
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value
