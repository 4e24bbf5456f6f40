"""The summary reward R_sum: the judge's 1-5 rating of the final reply, as (rating - 1) / 4.

The judge returns NaN when it could not rate a reply (transport errors, timeouts, an answer with
no rating, after its retries). What that becomes is the recipe's ``reward.judge_failure``:

- ``absent`` (default): the score stays NaN, so the estimators treat the summary segment as
  absent for that rollout (it neither moves its group's statistics nor receives an advantage);
- ``zero``: the paper's behaviour, a 0.0 that is then normalised as if it were a real rating;
- ``stop``: as ``absent``; and a step in which every judge (or simulator) request failed stops
  the run (``slca_exp.services.outage``).

Short-circuits (no tool response, a reply shorter than ten characters) are the judge's, and are
real scores of 0.0, not failures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from slca_exp.core import names

if TYPE_CHECKING:
    from slca_exp.rewards.judging import Judge, JudgeResult

FailurePolicy = Literal["absent", "zero", "stop"]
FAILURE_POLICIES: tuple[FailurePolicy, ...] = ("absent", "zero", "stop")


@dataclass(frozen=True)
class SummaryReward:
    """The summary reward of one rollout.

    Attributes:
        score: (rating - 1) / 4 in [0, 1]; 0.0 when short-circuited; NaN when the judge failed
            and the policy is ``absent``.
        rating: the judge's 1-5 rating, or ``None``.
        status: ``ok``, ``short_circuit`` or ``failed``.
        reason: why it was short-circuited or failed ("" when ok).
        cached: the judge answered from its cache.
        latency_ms: time the judge spent on it.
        raw_rating: the judge's own rating before ``judge.noise``; ``None`` when not perturbed
            (then it is ``rating``).

    """

    score: float
    rating: int | None
    status: str
    reason: str = ""
    cached: bool = False
    latency_ms: float = 0.0
    raw_rating: int | None = None

    @property
    def judge_rating(self) -> int | None:
        """The judge's own rating: ``raw_rating`` when noise perturbed it, else ``rating``."""
        return self.raw_rating if self.raw_rating is not None else self.rating


def from_judge(result: JudgeResult, failure: FailurePolicy = "absent") -> SummaryReward:
    """Apply the failure policy to one judge result."""
    if failure not in FAILURE_POLICIES:
        raise ValueError(
            f"unknown judge failure policy {failure!r}; expected {', '.join(FAILURE_POLICIES)}"
        )
    score = result.score
    if result.status == "failed" or not math.isfinite(score):
        score = 0.0 if failure == "zero" else math.nan  # absent, stop: no score
        return SummaryReward(score, None, "failed", result.reason, False, result.latency_ms)
    return SummaryReward(
        float(score),
        result.rating,
        result.status,
        result.reason,
        result.cached,
        result.latency_ms,
        result.raw_rating,
    )


def judge_stats(summaries: Sequence[SummaryReward]) -> dict[str, float]:
    """``judge/{requests,failures}`` (counts), ``cache_hit_frac`` and ``latency_ms`` of a batch.

    Where some rollout has a rating, also ``judge/rating`` and ``judge/raw_rating`` (their means:
    the ratings the rewards used and the judge's own, equal without ``judge.noise``) and
    ``judge/perturbed_frac`` (the fraction of ratings the noise changed).

    Requests are the rollouts the judge was asked about (not short-circuited); the cache hits
    and the latency are over those, the latency the mean over the ones not answered from the
    cache (0 when there are none).
    """
    asked = [s for s in summaries if s.status != "short_circuit"]
    served = [s.latency_ms for s in asked if not s.cached]
    rated = [s for s in summaries if s.rating is not None]
    stats = {
        names.JUDGE_REQUESTS: float(len(asked)),
        names.JUDGE_FAILURES: float(sum(s.status == "failed" for s in summaries)),
        names.JUDGE_CACHE_HIT_FRAC: sum(s.cached for s in asked) / len(asked) if asked else 0.0,
        names.JUDGE_LATENCY_MS: sum(served) / len(served) if served else 0.0,
    }
    if rated:  # judge.noise: the ratings the rewards used beside the judge's own
        stats[names.JUDGE_RATING] = sum(float(s.rating or 0) for s in rated) / len(rated)
        stats[names.JUDGE_RAW_RATING] = sum(float(s.judge_rating or 0) for s in rated) / len(rated)
        changed = sum(s.rating != s.judge_rating for s in rated)
        stats[names.JUDGE_PERTURBED_FRAC] = changed / len(rated)
    return stats


def summary_rewards(
    questions: Sequence[str],
    responses: Sequence[str],
    judge: Judge,
    *,
    failure: FailurePolicy = "absent",
    require_tool_response: Sequence[bool] | bool = True,
    view: str = "responses",
    prompt: str | None = None,
) -> list[SummaryReward]:
    """Judge a batch of rollouts in one call (the judge batches and caches its requests).

    Args:
        questions: (B,) the user questions.
        responses: (B,) decoded responses (tool calls, tool responses, final reply).
        judge: any :class:`~slca_exp.rewards.judging.Judge`.
        failure: the ``reward.judge_failure`` policy.
        require_tool_response: per rollout (or for all), whether a reply with no tool response
            short-circuits to 0 (the paper); the strict reward passes False for rows that need no
            call, so a correct no-call reply is judged on its merits.
        view: what the judge is shown (``reward.judge_view``: ``responses`` | ``interaction``).
        prompt: the judge's template for this reward (``reward.judge_prompt``); ``None``: the
            judge's own.

    Returns:
        (B,) :class:`SummaryReward`.

    """
    from slca_exp.rewards.judging import JudgeRequest

    if len(questions) != len(responses):
        raise ValueError(f"{len(questions)} questions for {len(responses)} responses")
    if isinstance(require_tool_response, bool):
        require_tool_response = [require_tool_response] * len(responses)
    requests = [
        JudgeRequest(q, r, bool(need), view, prompt)
        for q, r, need in zip(questions, responses, require_tool_response, strict=True)
    ]
    return [from_judge(result, failure) for result in judge.score(requests)]


def summary_reward(
    question: str,
    response_text: str,
    judge: Judge,
    *,
    failure: FailurePolicy = "absent",
    require_tool_response: bool = True,
    view: str = "responses",
    prompt: str | None = None,
) -> SummaryReward:
    """Judge one rollout; see :func:`summary_rewards`."""
    return summary_rewards(
        [question],
        [response_text],
        judge,
        failure=failure,
        require_tool_response=require_tool_response,
        view=view,
        prompt=prompt,
    )[0]
