"""Records from a batch as an engine holds it: the one path both engines take.

    local engine: Rollouts + RewardBatch + SegmentAdvantages + the update's old log-probs
    verl engine : the actor's batch (advantages, masks, old_log_probs, token ids) + the reward
                  side's ``reward_extra_info`` rows + the simulator's answers
      -> BatchView (per rollout: tokens, masks, segments, advantages, rewards, row, answers)
      -> records_of(view, picks, ...) -> [RolloutRecord]

Each engine fills a :class:`BatchView` from what it has and nothing else differs, so the two
engines' records (and everything rendered from them) carry the same fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from slca_exp.rollouts.drift import check_drift
from slca_exp.rollouts.record import Answer, Rewards, RolloutRecord, build_record
from slca_exp.rollouts.select import pick


@dataclass
class BatchView:
    """One batch of B rollouts, row-aligned.

    Attributes:
        response_ids: per rollout, the response's token ids (unpadded).
        response_mask: (B, T) 1 on generated tokens (responses right-padded, start at 0).
        tool_mask: (B, T) bool, the estimator's tool segment.
        summary_mask: (B, T) bool, the estimator's summary segment.
        advantages: (B, T) the token advantages the update uses; None for validation.
        logprobs: (B, T) the log-probs the tokens were sampled with; None when unknown.
        tool_adv: (B,) each rollout's tool advantage; None for validation.
        summary_adv: (B,) each rollout's summary advantage; None for validation.
        rows: per rollout, its data row.
        groups: per rollout, its prompt id.
        samples: per rollout, its index within its group.
        rewards: per rollout, its reward parts.
        answers: per rollout, the simulator's answers in call order (None: unknown).
        ends_on_tool_call: per rollout, cut off on an unanswered call.

    """

    response_ids: Sequence[Sequence[int]]
    response_mask: torch.Tensor
    tool_mask: torch.Tensor
    summary_mask: torch.Tensor
    advantages: torch.Tensor | None
    logprobs: torch.Tensor | None
    tool_adv: torch.Tensor | None
    summary_adv: torch.Tensor | None
    rows: Sequence[Mapping[str, Any]]
    groups: Sequence[str]
    samples: Sequence[int]
    rewards: Sequence[Rewards]
    answers: Sequence[Sequence[Answer]] | None
    ends_on_tool_call: Sequence[bool]

    def __len__(self) -> int:
        return len(self.response_ids)


def logged_rollouts(
    view: BatchView,
    *,
    per_step: int,
    decode: Callable[[list[int]], str],
    run: Mapping[str, Any],
    step: int,
    split: str,
    tokenizer: Any = None,  # noqa: ANN401
) -> list[RolloutRecord]:
    """The records of the rollouts a logged step shows (``rollouts.select``).

    Training batches give each logged group's best and worst rollout by routed total;
    validation batches (one rollout per prompt) their first ``per_step`` rollouts, in order.
    With ``tokenizer`` (the backbone's), each record's ids are checked against its chat
    template's rendering of the conversation (``RolloutRecord.drift``).
    """
    if split == "val":
        chosen = [(i, "") for i in range(min(per_step, len(view)))]
    else:
        totals = [r.total for r in view.rewards]
        chosen = pick(view.groups, totals, per_step)
    records = [
        _record(view, i, rank, decode=decode, run=run, step=step, split=split) for i, rank in chosen
    ]
    if tokenizer is not None:
        for record in records:
            try:
                record.drift = check_drift(record, tokenizer)
            except ValueError:  # a template that does not render the prompt as its start
                record.drift = None
    return records


def _record(
    view: BatchView,
    i: int,
    rank: str,
    *,
    decode: Callable[[list[int]], str],
    run: Mapping[str, Any],
    step: int,
    split: str,
) -> RolloutRecord:
    from slca_exp.core.rows import Row

    n = len(view.response_ids[i])
    row = Row(view.rows[i])
    has_tool = bool(view.tool_mask[i].any())
    has_summary = bool(view.summary_mask[i].any())
    return build_record(
        token_ids=list(view.response_ids[i]),
        decode=decode,
        response_mask=view.response_mask[i, :n].tolist(),
        tool_mask=view.tool_mask[i, :n].tolist(),
        summary_mask=view.summary_mask[i, :n].tolist(),
        advantages=None if view.advantages is None else view.advantages[i, :n].tolist(),
        logprobs=None if view.logprobs is None else view.logprobs[i, :n].tolist(),
        rewards=view.rewards[i],
        answers=None if view.answers is None else view.answers[i],
        run=run,
        step=step,
        split=split,
        group=view.groups[i],
        sample=int(view.samples[i]),
        prompt=row.prompt(),
        tools=row.tools(),
        gold=gold_calls(row.truth()),
        tool_adv=_segment_adv(view.tool_adv, i, has_tool),
        summary_adv=_segment_adv(view.summary_adv, i, has_summary),
        ends_on_tool_call=bool(view.ends_on_tool_call[i]),
        rank=rank,
    )


def gold_calls(truth: Any) -> list[dict[str, Any]]:  # noqa: ANN401
    """The row's gold calls as ``[{"name", "arguments"}]`` ([]: none, or unreadable)."""
    from slca_exp.rewards.gold import GroundTruthError, read_gold

    try:
        gold = read_gold(truth)
    except (GroundTruthError, ValueError, TypeError):
        return []
    return [{"name": c.name, "arguments": dict(c.arguments)} for c in gold.calls]


def samples_within_groups(groups: Sequence[Any]) -> list[int]:
    """Each rollout's index within its group, in batch order."""
    seen: dict[Any, int] = {}
    out = []
    for g in groups:
        out.append(seen.get(g, 0))
        seen[g] = out[-1] + 1
    return out


def rewards_of(
    tool: Any,  # noqa: ANN401 - a ToolReward
    summary: Any,  # noqa: ANN401 - a SummaryReward
    routed: tuple[float, float, float],
    *,
    hierr: float | None = None,
    outcome: str | None = None,
) -> Rewards:
    """Reward parts from a ``ToolReward``, a ``SummaryReward`` and the routed triple.

    ``hierr`` and ``outcome``: the HierR score and the verdict under the outcome reward.
    """
    return Rewards(
        tool=float(tool.score),
        components={k: float(v) for k, v in tool.components.items()},
        summary=float(summary.score),
        rating=summary.rating,
        raw_rating=getattr(summary, "judge_rating", summary.rating),
        judge_status=str(summary.status),
        judge_reason=str(getattr(summary, "reason", "") or ""),
        should_no_call=bool(tool.should_no_call),
        routed_tool=float(routed[0]),
        routed_summary=float(routed[1]),
        total=float(routed[2]),
        hierr=hierr,
        outcome=outcome,
    )


def _segment_adv(values: torch.Tensor | None, i: int, present: bool) -> float | None:
    if values is None or not present:
        return None
    value = float(values[i])
    return value if math.isfinite(value) else None
