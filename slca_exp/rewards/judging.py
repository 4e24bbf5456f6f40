"""What the summary reward asks of a judge: requests, results and the judge protocol.

The summary reward sends one :class:`JudgeRequest` per rollout and reads one
:class:`JudgeResult` back; any object with the :class:`Judge` methods will do. The judges
themselves (``slca_exp.judges``: the rubric judge, OpenAI-compatible servers, plugins) implement
this protocol; they sit above the rewards, which never import them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

LABELS: tuple[str, ...] = ("very poor", "poor", "acceptable", "good", "excellent")
"""The five rating labels; label ``LABELS[r - 1]`` is rating ``r``."""

STATUSES = ("ok", "short_circuit", "failed")

JUDGE_VIEWS: tuple[str, ...] = ("responses", "interaction")
"""What a summary judge may be shown of a rollout (``reward.judge_view``): ``responses``, the
numbered tool responses and the final reply (the main reward); ``interaction``, every tool call
and tool response and the reply, as the public v8.2 reward showed them."""


@dataclass(frozen=True)
class JudgeRequest:
    """One rollout to rate.

    Attributes:
        question: the user's question.
        response_text: the full decoded rollout (``<tool_call>`` and ``<tool_response>`` blocks,
            final reply).
        require_tool_response: ``False`` turns off the "no tool response -> 0" short-circuit for
            this request (the strict reward passes it on irrelevant rows, where not calling a
            tool was right; ``reward.no_tool_response=judge`` on every row).
        view: what the judge is shown, one of :data:`JUDGE_VIEWS` (``reward.judge_view``).
        prompt: the template to render it into (``reward.judge_prompt``: a file, or one shipped
            with the judges), instead of the judge's own; ``None``: the judge's. A judge that
            renders no template ignores it.

    """

    question: str
    response_text: str
    require_tool_response: bool = True
    view: str = "responses"
    prompt: str | None = None

    def __post_init__(self) -> None:
        if self.view not in JUDGE_VIEWS:
            known = ", ".join(JUDGE_VIEWS)
            raise ValueError(f"unknown judge view {self.view!r}; expected one of {known}")


@dataclass(frozen=True)
class JudgeResult:
    """The judge's verdict on one rollout.

    Attributes:
        rating: 1-5, or ``None`` when short-circuited or failed.
        score: ``(rating - 1) / 4``; 0.0 when short-circuited; NaN when failed.
        status: ``ok`` | ``short_circuit`` | ``failed``.
        reason: which short-circuit rule, or why it failed (never contains a secret).
        cached: answered from the persistent cache.
        latency_ms: time spent on this request (0 for cache hits and short-circuits).
        raw_rating: the judge's own rating when ``judge.noise`` perturbed it (``rating`` is then
            the perturbed one); ``None`` when nothing perturbed the rating.

    """

    rating: int | None
    score: float
    status: str
    reason: str = ""
    cached: bool = False
    latency_ms: float = 0.0
    raw_rating: int | None = None

    @classmethod
    def rated(
        cls,
        rating: int,
        *,
        reason: str | None = None,
        cached: bool = False,
        latency_ms: float = 0.0,
    ) -> JudgeResult:
        """An ``ok`` result for ``rating`` (1-5); ``reason`` defaults to the rating's label."""
        label = reason or LABELS[rating - 1]
        return cls(rating, (rating - 1) / 4.0, "ok", label, cached, latency_ms)

    @classmethod
    def short_circuit(cls, reason: str) -> JudgeResult:
        """A 0.0 score given by a rule, without asking the judge."""
        return cls(None, 0.0, "short_circuit", reason)

    @classmethod
    def failed(cls, reason: str, *, latency_ms: float = 0.0) -> JudgeResult:
        """A request the judge could not rate (score NaN)."""
        return cls(None, math.nan, "failed", reason, False, latency_ms)


@runtime_checkable
class Judge(Protocol):
    """What every judge provides; build one with ``slca_exp.judges.build_judge``."""

    name: str

    async def ascore(self, batch: Sequence[JudgeRequest]) -> list[JudgeResult]:
        """Rate a batch (awaitable from any event loop); results in request order."""
        ...

    def score(self, batch: Sequence[JudgeRequest]) -> list[JudgeResult]:
        """Rate a batch, blocking; works whether or not the calling thread runs a loop."""
        ...

    def describe(self) -> dict[str, Any]:
        """The recipe fields of this judge (backend, model, prompt version and hash, ...)."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters since construction: requests, short_circuits, cache_hits, failures."""
        ...

    def close(self) -> None:
        """Release connections and files (idempotent)."""
        ...

    def __enter__(self) -> Judge: ...

    def __exit__(self, *exc: object) -> None: ...


VERDICTS: tuple[str, ...] = ("Solved", "Unsolved", "Unsure")
"""An outcome judge's answers; only ``Solved`` scores 1."""


@dataclass(frozen=True)
class OutcomeRequest:
    """One rollout whose outcome to judge (``reward.tool_reward=outcome``).

    Attributes:
        question: the user's question.
        response_text: the full decoded rollout (tool calls, tool responses, final answer).
        gold_answers: the contents of the row's recorded answers to its gold calls, in order
            (``extra_info.tool_responses``; empty when the row records none). Only a judge that
            decides from facts reads them.
        needs_call: the row's gold makes at least one call.

    """

    question: str
    response_text: str
    gold_answers: tuple[str, ...] = ()
    needs_call: bool = True


@dataclass(frozen=True)
class OutcomeResult:
    """An outcome judge's verdict on one rollout: R_tool under the outcome reward.

    Attributes:
        verdict: ``Solved`` | ``Unsolved`` | ``Unsure`` (the last answer given), or ``None`` when
            the judge failed.
        score: 1.0 for ``Solved``, 0.0 for anything else, NaN when the judge failed (absent:
            never a score).
        status: ``ok`` | ``short_circuit`` (a rule decided without asking) | ``failed``.
        reason: which rule, or why it failed ("" when ok).
        fallback: the fallback prompt was asked (the first answer was ``Unsure``).
        cached: every answer it needed came from the persistent cache.
        latency_ms: time spent on the server (0 for cache hits and rules).

    """

    verdict: str | None
    score: float
    status: str
    reason: str = ""
    fallback: bool = False
    cached: bool = False
    latency_ms: float = 0.0

    @classmethod
    def decided(
        cls, verdict: str, *, fallback: bool = False, cached: bool = False, latency_ms: float = 0.0
    ) -> OutcomeResult:
        """An ``ok`` result for ``verdict`` (one of :data:`VERDICTS`)."""
        if verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {verdict!r}; expected one of {', '.join(VERDICTS)}")
        score = 1.0 if verdict == "Solved" else 0.0
        return cls(verdict, score, "ok", "", fallback, cached, latency_ms)

    @classmethod
    def short_circuit(cls, reason: str) -> OutcomeResult:
        """``Unsolved`` by a rule, without asking the judge."""
        return cls("Unsolved", 0.0, "short_circuit", reason)

    @classmethod
    def failed(
        cls, reason: str, *, fallback: bool = False, latency_ms: float = 0.0
    ) -> OutcomeResult:
        """A rollout the judge could not decide (score NaN: absent)."""
        return cls(None, math.nan, "failed", reason, fallback, False, latency_ms)


@runtime_checkable
class OutcomeJudge(Protocol):
    """What every outcome judge provides; build one with ``slca_exp.judges.build_outcome_judge``."""

    name: str

    def score(self, batch: Sequence[OutcomeRequest]) -> list[OutcomeResult]:
        """Decide a batch, blocking; results in request order, failures never raised."""
        ...

    def describe(self) -> dict[str, Any]:
        """The recipe fields of this judge (backend, model, prompts and their hashes, ...)."""
        ...

    def close(self) -> None:
        """Release connections and files (idempotent)."""
        ...
