"""HierR for a batch of rollouts, configured by the recipe's ``reward`` group.

The one object the engines call: tool process rewards (pure, per rollout), summary rewards (one
batched judge call), penalty routing, and the ``reward/*`` metrics. Under
``reward.tool_reward=outcome`` R_tool is an outcome judge's verdict instead (one batched call);
the tool process rewards are still computed and logged beside it.

What the summary judge is asked is the reward's too: what it is shown (``reward.judge_view``),
the template (``reward.judge_prompt``) and whether a rollout without a tool response is judged
at all (``reward.no_tool_response``); they travel with each request, so that any judge the run
uses (``judge=``) gets them. ``reward=hierr_v82`` sets all three as the public v8.2 reward had
them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from slca_exp.estimators.base import RolloutScores
from slca_exp.rewards.gold import Gold, read_gold
from slca_exp.rewards.hierr import (
    HierRWeights,
    ToolReward,
    Variant,
    reweighted,
    tool_process_reward,
)
from slca_exp.rewards.judging import JUDGE_VIEWS, OutcomeRequest, OutcomeResult
from slca_exp.rewards.routing import outcome_stats, reward_stats, route_batch
from slca_exp.rewards.summary import FailurePolicy, SummaryReward, judge_stats, summary_rewards

if TYPE_CHECKING:
    from slca_exp.rewards.judging import Judge, OutcomeJudge

TOOL_REWARDS = ("hierr", "outcome")
"""What R_tool is (``reward.tool_reward``)."""

NO_TOOLS = SummaryReward(0.0, None, "short_circuit", "the row allows no tools")
"""The paper variant's summary on a row whose ``allowed_tools`` is empty (no judge asked)."""

NO_TOOL_RESPONSE_RULES = ("zero", "judge")
"""What a rollout without a tool response gets (``reward.no_tool_response``): ``zero``, 0 without
asking the judge (the main reward); ``judge``, judged like any other (the public v8.2 reward)."""

NO_CALL = SummaryReward(0.0, None, "short_circuit", "no tool call where one was needed")
"""The summary of a no-call the penalty scores, under ``no_tool_response=judge``: as in the
public rewards, the judge is not asked (the penalty is the rollout's total)."""


@dataclass(frozen=True)
class RewardBatch:
    """HierR rewards of a batch of B rollouts.

    Attributes:
        scores: (B,) routed tool / summary / total scores for the estimators.
        tool: per rollout R_tool before routing: the tool process reward, or under
            ``tool_reward=outcome`` the same with the outcome verdict's score (NaN: the outcome
            judge failed, R_tool absent) as its ``score``.
        summary: per rollout summary rewards.
        stats: the ``reward/*``, ``judge/*`` (and ``outcome/*``) metrics.
        hierr: per rollout tool process rewards (gold matching), as logged: ``tool`` itself
            under ``tool_reward=hierr`` unless ``logged_weights`` weigh them otherwise.
        outcome: per rollout the outcome judge's result (``None`` where it was not asked: a
            penalised no-call); empty under ``tool_reward=hierr``.
        evaluated: the routed scores of ``hierr`` where ``logged_weights`` weigh it otherwise
            than R_tool (the totals ``val/success@k`` reads, :attr:`success_totals`); ``None``:
            ``scores``.

    """

    scores: RolloutScores
    tool: list[ToolReward]
    summary: list[SummaryReward]
    stats: dict[str, float]
    hierr: list[ToolReward] = field(default_factory=list)
    outcome: list[OutcomeResult | None] = field(default_factory=list)
    evaluated: RolloutScores | None = None

    @property
    def success_totals(self) -> list[float]:
        """(B,) the totals the paper's success@k is read from (NaN: not scored)."""
        scores = self.scores if self.evaluated is None else self.evaluated
        return [float(x) for x in scores.total.tolist()]


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
    tool_reward: str = "hierr"
    judge_view: str = "responses"
    judge_prompt: str | None = None
    no_tool_response: str = "zero"
    logged_weights: HierRWeights | None = None
    """The logged HierR score's weights, when not ``weights`` (``reward.logged_weights``)."""

    def __post_init__(self) -> None:
        for key, value, known in (
            ("tool_reward", self.tool_reward, TOOL_REWARDS),
            ("judge_view", self.judge_view, JUDGE_VIEWS),
            ("no_tool_response", self.no_tool_response, NO_TOOL_RESPONSE_RULES),
        ):
            if value not in known:
                raise ValueError(f"reward.{key}={value!r}; expected one of {', '.join(known)}")

    @classmethod
    def from_config(cls, reward: Any) -> HierRReward:  # noqa: ANN401 - RewardConfig or mapping
        """From a validated ``reward`` config; ``normalize: true`` rescales the tool weights."""
        if isinstance(reward, Mapping):
            get = reward.get
        else:
            get = lambda k, default=None: getattr(reward, k, default)  # noqa: E731
        weights = HierRWeights.from_config(get("tool_weights"))
        if get("normalize"):
            weights = weights.normalized()
        prompt = get("judge_prompt")
        logged = get("logged_weights")
        return cls(
            variant=get("variant"),
            weights=weights,
            process_weight=float(get("process_weight")),
            summary_weight=float(get("summary_weight")),
            no_call_penalty=float(get("no_call_penalty")),
            judge_failure=get("judge_failure"),
            normalize_strings=bool(get("normalize_strings")),
            tool_reward=str(get("tool_reward") or "hierr"),
            judge_view=str(get("judge_view") or "responses"),
            judge_prompt=str(prompt) if prompt else None,
            no_tool_response=str(get("no_tool_response") or "zero"),
            logged_weights=None if logged is None else HierRWeights.from_config(logged),
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
        *,
        outcome: OutcomeJudge | None = None,
        recorded: Sequence[Sequence[Any]] | None = None,
    ) -> RewardBatch:
        """Score B rollouts; ``ground_truths[i]`` is rollout i's row ground truth.

        Args:
            responses: (B,) decoded rollouts.
            ground_truths: (B,) their rows' ground truths.
            judge: the summary judge.
            outcome: the outcome judge (``tool_reward=outcome``; ignored under ``hierr``).
            recorded: (B,) each row's recorded answers of its gold calls (``Row.recorded()``),
                for an outcome judge that decides from facts; ``None``: none recorded.

        Raises:
            ValueError: lengths differ, or ``tool_reward=outcome`` without an outcome judge.

        """
        if len(responses) != len(ground_truths):
            raise ValueError(f"{len(responses)} responses for {len(ground_truths)} ground truths")
        golds = _read_all(ground_truths)
        tools = [self.tool(text, gold) for text, gold in zip(responses, golds, strict=True)]
        hierr = tools
        if self.logged_weights is not None:  # logged under other weights than R_tool's
            hierr = [reweighted(t, self.logged_weights) for t in tools]
        judge_all = self.no_tool_response == "judge"
        # The public reward scores a row that allows no tools 0 without asking the judge, and
        # never asks about a no-call the penalty scores (which the "no tool response -> 0" rule
        # short-circuits anyway where it is on).
        asked = [
            i
            for i, g in enumerate(golds)
            if (self.variant == "strict" or g.allowed)
            and not (judge_all and tools[i].should_no_call)
        ]
        need = [
            needs_tool_response(self.variant, self.no_tool_response, golds[i].needs_call)
            for i in asked
        ]
        judged = (
            summary_rewards(
                [golds[i].question for i in asked],
                [responses[i] for i in asked],
                judge,
                failure=self.judge_failure,
                require_tool_response=need,
                view=self.judge_view,
                prompt=self.judge_prompt,
            )
            if asked
            else []
        )
        summaries = [
            NO_TOOLS if self.variant == "paper" and not g.allowed else NO_CALL for g in golds
        ]
        for i, summary in zip(asked, judged, strict=True):
            summaries[i] = summary
        outcomes: list[OutcomeResult | None] = []
        objective = tools
        if self.tool_reward == "outcome":
            outcomes = self._outcomes(responses, golds, tools, asked, outcome, recorded)
            objective = [
                t if o is None else replace(t, score=o.score)
                for t, o in zip(tools, outcomes, strict=True)
            ]
        scores = route_batch(
            objective,
            summaries,
            process_weight=self.process_weight,
            summary_weight=self.summary_weight,
        )
        stats = reward_stats(objective, summaries, scores, hierr=hierr) | judge_stats(summaries)
        if self.tool_reward == "outcome":
            stats |= outcome_stats(outcomes)
        evaluated = None
        if hierr is not tools and self.tool_reward == "hierr":  # success@k as the paper reads it
            evaluated = route_batch(
                hierr,
                summaries,
                process_weight=self.process_weight,
                summary_weight=self.summary_weight,
            )
        return RewardBatch(scores, objective, summaries, stats, hierr, outcomes, evaluated)

    def _outcomes(
        self,
        responses: Sequence[str],
        golds: Sequence[Gold],
        tools: Sequence[ToolReward],
        allowed: Sequence[int],
        outcome: OutcomeJudge | None,
        recorded: Sequence[Sequence[Any]] | None,
    ) -> list[OutcomeResult | None]:
        """The outcome judge's result per rollout; ``None`` for a penalised no-call."""
        if outcome is None:
            raise ValueError(
                "reward.tool_reward=outcome needs an outcome judge "
                "(slca_exp.judges.build_outcome_judge)"
            )
        if recorded is not None and len(recorded) != len(responses):
            raise ValueError(f"{len(recorded)} recorded answer lists for {len(responses)} rollouts")
        # Asked where the judge is asked, except a no-call the penalty already scores.
        ask = [i for i in allowed if not tools[i].should_no_call]
        requests = [
            OutcomeRequest(
                golds[i].question,
                responses[i],
                gold_answers=_contents(recorded[i]) if recorded is not None else (),
                needs_call=golds[i].needs_call,
            )
            for i in ask
        ]
        out: list[OutcomeResult | None] = [None] * len(responses)
        for i, result in zip(ask, outcome.score(requests) if requests else [], strict=True):
            out[i] = result
        return out


def _contents(answers: Sequence[Any]) -> tuple[str, ...]:
    """The content of each recorded answer (``{"name", "arguments", "content"}``)."""
    return tuple(str(a.get("content", "")) if isinstance(a, Mapping) else str(a) for a in answers)


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


def needs_tool_response(variant: str, no_tool_response: str, needs_call: bool) -> bool:
    """Whether a reply without a tool response is scored 0 without asking the judge.

    ``no_tool_response=judge`` asks about every reply; otherwise the strict variant asks about a
    row that needs no call (defect (d)) and the paper's short-circuits every reply without one.

    >>> needs_tool_response("strict", "zero", False), needs_tool_response("paper", "zero", False)
    (False, True)

    """
    if no_tool_response == "judge":
        return False
    return needs_call if variant == "strict" else True
