"""Token drift: the ids an update trained on against what the chat template renders.

A multi-turn rollout is assembled token by token: the prompt, each generated assistant turn, the
tool turns the environment injects between them. Nothing forces that assembly to equal the chat
template's rendering of the same conversation: a separator dropped at an assistant/tool
boundary, a tool response injected twice, a template that rewrites earlier turns all leave the
policy trained on token sequences it will never see at inference. This module renders the
conversation again and compares::

    RolloutRecord (prompt messages, tools, turns, the simulator's answers, token ids)
      -> conversation(): system/user, one assistant message per generated turn (its text), one
         tool message per answer that followed it
      -> reference_ids(): the template's text of the response, cut into the assistant turns and
         the environment's pieces between them; the environment's pieces tokenized alone (the way
         both engines inject them); an assistant piece as the policy's own tokens for as long as
         their text is what the template renders there (a sampled turn need not be the
         tokenizer's canonical split of its text), the rest of it tokenized
      -> check_drift(): a token diff of the two sequences -> TokenDrift

The policy's own tokens are the ground truth for what it generated; what is checked is every
token around them: the environment's glue, every turn's end-of-turn token, and any text the
template would render differently.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from slca_exp.backbones.chat import IM_END, render_prompt, render_trajectory
from slca_exp.core import names

SHOWN_TOKENS = 4
"""How many tokens of each side :attr:`TokenDrift.expected` and ``found`` show."""


@dataclass
class TokenDrift:
    """How a rollout's token ids differ from the chat template's rendering of its conversation.

    Attributes:
        mismatched: tokens that differ: per edit of the token diff, the longer of its two sides
            (a dropped separator: 1; 0 when the ids are the rendering's).
        tokens: tokens of the longer of the two sequences (the fraction's denominator).
        first: the first response position where they differ (an index into the rollout's
            ids; its length when the rollout lacks tokens at its end), None when they agree.
        expected: the rendering's text from where they part (:data:`SHOWN_TOKENS` tokens).
        found: the rollout's text from ``first`` (as many tokens).
        where: the piece of the rendering ``first`` falls in: ``tool turn`` (the environment's
            glue), ``assistant turn``, or "" when they agree.
        marks: ``[position, expected]`` per rollout token that differs (replaced or extra), and
            per gap where the rendering has tokens the rollout lacks (the position after the
            gap, ``expected`` the missing text): what the credit view marks.

    """

    mismatched: int
    tokens: int
    first: int | None = None
    expected: str = ""
    found: str = ""
    where: str = ""
    marks: list[list[Any]] = field(default_factory=list)


def mismatch_frac(drifts: Sequence[TokenDrift]) -> float:
    """Mismatched tokens over all tokens of ``drifts`` (0.0 for none).

    >>> mismatch_frac([TokenDrift(1, 50), TokenDrift(0, 50)])
    0.01
    """
    total = sum(d.tokens for d in drifts)
    return sum(d.mismatched for d in drifts) / total if total else 0.0


def drift_metrics(records: Sequence[Any], split: str) -> dict[str, float]:  # noqa: ANN401
    """``rollout/token_mismatch_frac`` (``val/...`` on validation) of the checked ``records``."""
    drifts = [r.drift for r in records if r.drift is not None]
    if not drifts:
        return {}
    name = names.ROLLOUT_TOKEN_MISMATCH_FRAC
    return {names.val(name) if split == "val" else name: mismatch_frac(drifts)}


def conversation(record: Any) -> tuple[list[dict[str, Any]], bool]:  # noqa: ANN401
    """The record's messages and whether its last assistant turn was closed.

    Returns:
        ``(messages, closed)``: the prompt's messages, then per generated turn an assistant
        message whose content is the turn's text less its closing ``<|im_end|>``, and after it one
        ``tool`` message per answer the environment gave; ``closed``: the last assistant turn
        ended with ``<|im_end|>`` (False: cut off by the budget, or ended by another token).

    """
    messages = [dict(m) for m in record.prompt]
    answers: dict[int, list[str]] = {}
    for call in record.calls:
        if call.answer is not None:
            answers.setdefault(call.turn, []).append(call.answer.content)
    closed = True
    assistant = -1
    for turn in record.turns:
        if turn.role == "assistant":
            assistant += 1
            closed = turn.text.endswith(IM_END)
            content = turn.text[: -len(IM_END)] if closed else turn.text
            messages.append({"role": "assistant", "content": content})
        else:
            for content in answers.get(assistant, []):
                messages.append({"role": "tool", "content": content})
    return messages, closed


def reference_ids(record: Any, tokenizer: Any) -> tuple[list[int], list[str]]:  # noqa: ANN401
    """The response's ids as the chat template renders the record's conversation.

    Returns:
        ``(ids, kinds)``: the ids, and per id the piece it belongs to (``assistant turn`` or
        ``tool turn``).

    Raises:
        ValueError: the template does not render the prompt as the start of the conversation.

    """
    messages, closed = conversation(record)
    prompt = render_prompt(tokenizer, record.prompt, record.tools or None)
    ends_on_tool = bool(messages) and messages[-1]["role"] == "tool"
    text, spans = render_trajectory(
        tokenizer, messages, record.tools or None, generation_prompt=ends_on_tool
    )
    if not text.startswith(prompt):
        raise ValueError("the chat template does not render the prompt as the conversation's start")
    turns = [t for t in record.turns if t.role == "assistant"]
    pieces: list[tuple[str, str, list[int] | None]] = []  # (kind, text, the policy's own ids)
    pos = len(prompt)
    for k, ((start, end), turn) in enumerate(zip(spans, turns, strict=True)):
        if start > pos:
            pieces.append(("tool turn", text[pos:start], None))
        if k == len(spans) - 1 and not closed:
            end -= len(IM_END)  # the rollout ends inside this turn: the template closes it
        own = record.token_ids[turn.start : turn.end]
        pieces.append(("assistant turn", text[start:end], own))
        pos = end
    if ends_on_tool or not spans:
        pieces.append(("tool turn", text[pos:], None))
    ids: list[int] = []
    kinds: list[str] = []
    for kind, piece, own in pieces:
        kept = _own_prefix(tokenizer, own or [], piece)
        rest = piece[len(turn_text(tokenizer, kept)) :]
        part = kept + (tokenizer(rest, add_special_tokens=False)["input_ids"] if rest else [])
        ids += part
        kinds += [kind] * len(part)
    return ids, kinds


def _own_prefix(tokenizer: Any, own: Sequence[int], piece: str) -> list[int]:  # noqa: ANN401
    """The longest start of the policy's own ids whose text starts ``piece``."""
    for k in range(len(own), 0, -1):
        if piece.startswith(turn_text(tokenizer, own[:k])):
            return list(own[:k])
    return []


def turn_text(tokenizer: Any, ids: Sequence[int]) -> str:  # noqa: ANN401
    """``ids`` decoded with special tokens kept (how a record's turn texts are decoded)."""
    return tokenizer.decode(list(ids), skip_special_tokens=False)


def check_drift(record: Any, tokenizer: Any) -> TokenDrift:  # noqa: ANN401
    """The record's token ids against the template's rendering of its conversation."""
    used = list(record.token_ids)
    ref, kinds = reference_ids(record, tokenizer)
    size = max(len(used), len(ref))
    if used == ref:
        return TokenDrift(0, size)
    ops = difflib.SequenceMatcher(None, used, ref, autojunk=False).get_opcodes()
    edits = [op for op in ops if op[0] != "equal"]
    mismatched = sum(max(i2 - i1, j2 - j1) for _, i1, i2, j1, j2 in edits)
    marks: list[list[Any]] = []
    for _, i1, i2, j1, j2 in edits:
        missing = turn_text(tokenizer, ref[j1:j2])
        if i2 == i1:  # the rollout lacks ref[j1:j2] before its token i1
            marks.append([min(i1, len(used) - 1), missing])
        else:
            marks += [[i, missing if i == i1 else ""] for i in range(i1, i2)]
    _, i1, i2, j1, j2 = edits[0]
    return TokenDrift(
        mismatched=mismatched,
        tokens=size,
        first=i1,
        expected=turn_text(tokenizer, ref[j1 : j1 + SHOWN_TOKENS]),
        found=turn_text(tokenizer, used[i1 : i1 + SHOWN_TOKENS]),
        where=kinds[min(j1, len(kinds) - 1)] if kinds else "",
        marks=[m for m in marks if m[0] >= 0],
    )
