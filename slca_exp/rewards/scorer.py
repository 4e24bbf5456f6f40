"""HierR for a batch of rollouts, configured by the recipe's ``reward`` group.

The one object the engines call: tool process rewards (pure, per rollout), summary rewards (one
batched judge call), penalty routing, and the ``reward/*`` metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slca_exp.estimators.base import RolloutScores
from slca_exp.rewards.gold import Gold, read_gold
from slca_exp.rewards.hierr import HierRWeights, ToolReward, Variant, tool_process_reward
from slca_exp.rewards.routing import reward_stats, route_batch
from slca_exp.rewards.summary import FailurePolicy, SummaryReward, judge_stats, summary_rewards

if TYPE_CHECKING:
    from slca_exp.rewards.judging import Judge

NO_TOOLS = SummaryReward(0.0, None, "short_circuit", "the row allows no tools")
"""The paper variant's summary on a row whose ``allowed_tools`` is empty (no judge asked)."""


@dataclass(frozen=True)
class RewardBatch:
    """HierR rewards of a batch of B rollouts.

    Attributes:
        scores: (B,) routed tool / summary / total scores for the estimators.
        tool: per rollout tool process rewards.
        summary: per rollout summary rewards.
        stats: the ``reward/*`` and ``judge/*`` metrics.

    """

    scores: RolloutScores
    tool: list[ToolReward]
    summary: list[SummaryReward]
    stats: dict[str, float]


@dataclass(frozen=True)
class HierRReward:
    """The recipe's HierR reward (``reward.*``); see ``conf/reward/``."""

    variant: Variant = "strict"
    weights: HierRWeights = HierRWeights()  # noqa: RUF009 - frozen
    process_weight: float = 1.0
    summary_weight: float = 1.0
    no_call_penalty: float = -0.5
    judge_failure: FailurePolicy = "absent"
    normalize_strings: bool = False

    @classmethod
    def from_config(cls, reward: Any) -> HierRReward:  # noqa: ANN401 - RewardConfig or mapping
        """From a validated ``reward`` config; ``normalize: true`` rescales the tool weights."""
        get = reward.get if isinstance(reward, Mapping) else (lambda k: getattr(reward, k))
        weights = HierRWeights.from_config(get("tool_weights"))
        if get("normalize"):
            weights = weights.normalized()
        return cls(
            variant=get("variant"),
            weights=weights,
            process_weight=float(get("process_weight")),
            summary_weight=float(get("summary_weight")),
            no_call_penalty=float(get("no_call_penalty")),
            judge_failure=get("judge_failure"),
            normalize_strings=bool(get("normalize_strings")),
        )

    def tool(self, response_text: str, ground_truth: Mapping[str, Any] | str | Gold) -> ToolReward:
        """The tool process reward of one rollout."""
        return tool_process_reward(
            response_text,
            ground_truth,
            self.weights,
            self.variant,
            no_call_penalty=self.no_call_penalty,
            normalize_strings=self.normalize_strings,
        )

    def score(
        self,
        responses: Sequence[str],
        ground_truths: Sequence[Mapping[str, Any] | str | Gold],
        judge: Judge,
    ) -> RewardBatch:
        """Score B rollouts; ``ground_truths[i]`` is rollout i's row ground truth."""
        if len(responses) != len(ground_truths):
            raise ValueError(f"{len(responses)} responses for {len(ground_truths)} ground truths")
        golds = _read_all(ground_truths)
        tools = [self.tool(text, gold) for text, gold in zip(responses, golds, strict=True)]
        # The public reward scores a row that allows no tools 0 without asking the judge.
        asked = [i for i, g in enumerate(golds) if self.variant == "strict" or g.allowed]
        # The strict variant judges a reply on a row that needs no call even without a tool
        # response (defect (d)); the paper short-circuits it to 0.
        need = [golds[i].needs_call for i in asked] if self.variant == "strict" else True
        judged = (
            summary_rewards(
                [golds[i].question for i in asked],
                [responses[i] for i in asked],
                judge,
                failure=self.judge_failure,
                require_tool_response=need,
            )
            if asked
            else []
        )
        summaries = [NO_TOOLS] * len(golds)
        for i, summary in zip(asked, judged, strict=True):
            summaries[i] = summary
        scores = route_batch(
            tools,
            summaries,
            process_weight=self.process_weight,
            summary_weight=self.summary_weight,
        )
        stats = reward_stats(tools, summaries, scores) | judge_stats(summaries)
        return RewardBatch(scores, tools, summaries, stats)


def _read_all(ground_truths: Sequence[Mapping[str, Any] | str | Gold]) -> list[Gold]:
    """Read each distinct ground truth once (a group's G rollouts share one object)."""
    seen: dict[int, Gold] = {}
    out = []
    for gt in ground_truths:
        gold = seen.get(id(gt))
        if gold is None:
            gold = seen[id(gt)] = read_gold(gt)
        out.append(gold)
    return out
