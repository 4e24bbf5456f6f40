"""Rollout records from token ids and masks, and the same record with one token dropped."""

from __future__ import annotations

from collections.abc import Sequence

from slca_exp.rollouts import Answer, Rewards, RolloutRecord, build_record

REWARDS = Rewards(0.5, {}, 0.5, 3, "ok", "", False, 0.5, 0.5, 1.0)
"""Reward parts no drift check reads."""


def record_of(
    tokenizer,
    ids: Sequence[int],
    mask: Sequence[int],
    *,
    prompt: list[dict],
    tools: list[dict],
    answers: Sequence[Answer],
    sample: int = 0,
) -> RolloutRecord:
    """A validation record of a response, its generated tokens in the tool segment."""
    n = len(ids)
    return build_record(
        token_ids=list(ids),
        decode=lambda t: tokenizer.decode(t, skip_special_tokens=False),
        response_mask=list(mask),
        tool_mask=[bool(m) for m in mask],
        summary_mask=[False] * n,
        advantages=None,
        logprobs=None,
        rewards=REWARDS,
        answers=list(answers),
        run={"algorithm": "slca_grpo", "seed": 0, "engine": "local"},
        step=0,
        split="val",
        group="val-0",
        sample=sample,
        prompt=prompt,
        tools=tools,
        gold=[],
        tool_adv=None,
        summary_adv=None,
        ends_on_tool_call=False,
    )


def without_token(tokenizer, record: RolloutRecord, position: int) -> RolloutRecord:
    """``record`` with its token at ``position`` dropped (the same answers, prompt and tools)."""
    ids = record.token_ids[:position] + record.token_ids[position + 1 :]
    mask = [0 if c == "e" else 1 for c in record.segments]
    mask = mask[:position] + mask[position + 1 :]
    answers = [c.answer for c in record.calls if c.answer is not None]
    return record_of(
        tokenizer, ids, mask, prompt=record.prompt, tools=record.tools, answers=answers
    )


def first_glue_position(record: RolloutRecord) -> int | None:
    """The first environment token of the record's response (its first tool turn's start)."""
    return next((t.start for t in record.turns if t.role == "tool"), None)
