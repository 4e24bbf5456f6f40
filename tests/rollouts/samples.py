"""Rollout records built the way the engines build them, from tokens, masks and rewards.

A word-level "tokenizer" (one token per word or tag) keeps the records readable; the masks and
segments come from the package's own split (``split_segments``), as on both engines.
"""

from __future__ import annotations

import json
import math
import random

import torch

from slca_exp.estimators.segments import split_segments
from slca_exp.rollouts import Answer, Rewards, RolloutRecord, build_record

RUN = {"algorithm": "slca_grpo", "seed": 7, "engine": "local"}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
ANSWER = '{"temp": 21}'
GLUE = (
    f"<|im_start|>user <tool_response>\n{ANSWER}\n</tool_response><|im_end|> <|im_start|>assistant "
)


class WordTokenizer:
    """Ids for the pieces of a text split on spaces (the spaces kept on the next piece)."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.pieces: list[str] = []

    def encode(self, text: str) -> list[int]:
        words = text.split(" ")
        pieces = [words[0]] + [" " + w for w in words[1:]]
        ids = []
        for piece in pieces:
            if piece not in self.vocab:
                self.vocab[piece] = len(self.pieces)
                self.pieces.append(piece)
            ids.append(self.vocab[piece])
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


def rewards(total: float, rating: int | None = 4) -> Rewards:
    """Reward parts whose routed total is ``total``."""
    parts = {"format": 1.0, "name": 1.0, "key": 1.0, "value": 0.5, "parallel": 1.0}
    summary = math.nan if rating is None else (rating - 1) / 4
    return Rewards(
        tool=0.9,
        components=parts,
        summary=summary,
        rating=rating,
        judge_status="ok" if rating is not None else "failed",
        judge_reason="" if rating is not None else "HTTP 500 after 1 attempt",
        should_no_call=False,
        routed_tool=0.9,
        routed_summary=summary,
        total=total,
    )


def record(
    *,
    tok: WordTokenizer | None = None,
    summary: str = "It is 21 degrees in Paris.<|im_end|>",
    tool_adv: float = 0.8,
    summary_adv: float = -0.5,
    total: float = 1.4,
    step: int = 10,
    split: str = "train",
    group: str = "train-3",
    sample: int = 0,
    rank: str = "best",
    rating: int | None = 4,
) -> RolloutRecord:
    """One rollout: a tool call, the simulator's answer (injected), a summary."""
    tok = tok or WordTokenizer()
    call, glue, final = tok.encode(CALL + "<|im_end|>"), tok.encode(GLUE), tok.encode(summary)
    ids = call + glue + final
    mask = torch.tensor([[1] * len(call) + [0] * len(glue) + [1] * len(final)])
    split_ = split_segments(mask)
    tool_mask, summary_mask = split_.tool_mask[0].tolist(), split_.summary_mask[0].tolist()
    validation = split == "val"
    adv = None
    if not validation:
        adv = [
            tool_adv if t else summary_adv if s else 0.0
            for t, s in zip(tool_mask, summary_mask, strict=True)
        ]
    rng = random.Random(len(ids))
    logprobs = [-rng.random() * 3 if m else math.nan for m in mask[0].tolist()]
    return build_record(
        token_ids=ids,
        decode=tok.decode,
        response_mask=mask[0].tolist(),
        tool_mask=tool_mask,
        summary_mask=summary_mask,
        advantages=adv,
        logprobs=logprobs,
        rewards=rewards(total, rating),
        answers=[Answer(ANSWER, "ok", "recorded", False)],
        run=RUN,
        step=step,
        split=split,
        group=group,
        sample=sample,
        prompt=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[{"type": "function", "function": {"name": "get_weather"}}],
        gold=[{"name": "get_weather", "arguments": json.loads('{"city": "Paris"}')}],
        tool_adv=None if validation else tool_adv,
        summary_adv=None if validation else summary_adv,
        ends_on_tool_call=False,
        rank=rank,
    )


def step_records(step: int = 10, split: str = "train") -> list[RolloutRecord]:
    """A logged step: two groups, each by its best and its worst rollout."""
    tok = WordTokenizer()
    if split == "val":
        return [
            record(tok=tok, step=step, split="val", group=f"val-{k}", sample=0, rank="")
            for k in range(3)
        ]
    return [
        record(tok=tok, step=step, group="train-3", sample=2, rank="best", total=1.6),
        record(
            tok=tok,
            step=step,
            group="train-3",
            sample=5,
            rank="worst",
            total=0.2,
            tool_adv=-1.1,
            summary_adv=-0.9,
            summary="no idea<|im_end|>",
            rating=1,
        ),
        record(tok=tok, step=step, group="train-9", sample=0, rank="best", total=1.2),
        record(
            tok=tok,
            step=step,
            group="train-9",
            sample=7,
            rank="worst",
            total=math.nan,
            rating=None,
            summary_adv=0.0,
        ),
    ]
