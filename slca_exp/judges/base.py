"""The judge protocol: requests, results, the paper's short-circuits and the batch metrics.

A judge rates the final reply of a rollout 1-5 from the question, the numbered
``<tool_response>`` contents and the text after the last ``</tool_response>``; the summary score is
``(rating - 1) / 4``. A judge never invents a score: when it cannot rate, the result is
``status="failed"`` with ``score=NaN`` and the reward's failure policy decides what that means.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from slca_exp.rewards.toolcalls import final_reply, tool_responses

LABELS: tuple[str, ...] = ("very poor", "poor", "acceptable", "good", "excellent")
"""The five rating labels; label ``LABELS[r - 1]`` is rating ``r``."""

STATUSES = ("ok", "short_circuit", "failed")

# Defined in tracking/names.py (METRICS); a test pins that these stay there.
FAILURES, CACHE_HIT_FRAC, LATENCY_MS = "judge/failures", "judge/cache_hit_frac", "judge/latency_ms"
REQUESTS = "judge/requests"


@dataclass(frozen=True)
class JudgeRequest:
    """One rollout to rate.

    Attributes:
        question: the user's question.
        response_text: the full decoded rollout (``<tool_call>`` and ``<tool_response>`` blocks,
            final reply).
        require_tool_response: ``False`` turns off the "no tool response -> 0" short-circuit for
            this request (the strict reward passes it on irrelevant rows, where not calling a
            tool was right).

    """

    question: str
    response_text: str
    require_tool_response: bool = True


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

    """

    rating: int | None
    score: float
    status: str
    reason: str = ""
    cached: bool = False
    latency_ms: float = 0.0

    @classmethod
    def rated(cls, rating: int, *, cached: bool = False, latency_ms: float = 0.0) -> JudgeResult:
        """An ``ok`` result for ``rating`` (1-5)."""
        return cls(rating, (rating - 1) / 4.0, "ok", LABELS[rating - 1], cached, latency_ms)

    @classmethod
    def short_circuit(cls, reason: str) -> JudgeResult:
        """A 0.0 score given by a rule, without asking the judge."""
        return cls(None, 0.0, "short_circuit", reason)

    @classmethod
    def failed(cls, reason: str, *, latency_ms: float = 0.0) -> JudgeResult:
        """A request the judge could not rate (score NaN)."""
        return cls(None, math.nan, "failed", reason, False, latency_ms)


@dataclass(frozen=True)
class JudgeView:
    """What a judge sees of a rollout: the question, the tool responses and the final reply."""

    question: str
    tool_responses: tuple[str, ...]
    reply: str

    @classmethod
    def of(cls, request: JudgeRequest) -> JudgeView:
        """Extract the view from a request (linear scans, see ``rewards.toolcalls``)."""
        text = request.response_text
        return cls(request.question, tuple(tool_responses(text)), final_reply(text))


def short_circuit(
    view: JudgeView,
    request: JudgeRequest,
    *,
    no_tool_response: bool,
    min_reply_chars: int,
) -> JudgeResult | None:
    """The paper's rules that score 0 without asking the judge, or ``None`` when none applies.

    Args:
        view: the extracted rollout.
        request: the request (its ``require_tool_response``).
        no_tool_response: rule 1 is on (config ``judge.short_circuit_no_tool_response``).
        min_reply_chars: rule 2's threshold (config ``judge.min_reply_chars``; 0 turns it off).

    """
    if no_tool_response and request.require_tool_response and not view.tool_responses:
        return JudgeResult.short_circuit("no tool response")
    if len(view.reply) < min_reply_chars:
        return JudgeResult.short_circuit(f"reply shorter than {min_reply_chars} characters")
    return None


def batch_stats(results: Sequence[JudgeResult]) -> dict[str, float]:
    """The judge metrics of one batch, named as in ``tracking/names.py``.

    ``judge/requests`` counts the requests that needed the judge (not short-circuited),
    ``judge/failures`` the failed ones; ``judge/cache_hit_frac`` and ``judge/latency_ms`` are
    over the requests: the fraction answered from the cache, and the mean latency of those that
    were not (0.0 when there are none).
    """
    asked = [r for r in results if r.status != "short_circuit"]
    served = [r.latency_ms for r in asked if not r.cached]
    return {
        REQUESTS: float(len(asked)),
        FAILURES: float(sum(r.status == "failed" for r in results)),
        CACHE_HIT_FRAC: sum(r.cached for r in asked) / len(asked) if asked else 0.0,
        LATENCY_MS: sum(served) / len(served) if served else 0.0,
    }


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


class JudgeBase(ABC):
    """Shared plumbing: the config's short-circuits, counters and the context manager."""

    name = ""

    def __init__(self, cfg: Any) -> None:  # noqa: ANN401
        self.cfg = cfg
        self._counts = {"requests": 0, "short_circuits": 0, "cache_hits": 0, "failures": 0}

    def _short_circuit(self, view: JudgeView, request: JudgeRequest) -> JudgeResult | None:
        return short_circuit(
            view,
            request,
            no_tool_response=bool(self.cfg.short_circuit_no_tool_response),
            min_reply_chars=int(self.cfg.min_reply_chars),
        )

    def _count(self, results: Sequence[JudgeResult]) -> list[JudgeResult]:
        self._counts["requests"] += len(results)
        for r in results:
            self._counts["short_circuits"] += r.status == "short_circuit"
            self._counts["cache_hits"] += r.cached
            self._counts["failures"] += r.status == "failed"
        return list(results)

    def stats(self) -> dict[str, float]:
        """Counters since construction: requests, short_circuits, cache_hits, failures."""
        return {k: float(v) for k, v in self._counts.items()}

    def describe(self) -> dict[str, Any]:
        """The recipe fields of this judge."""
        return type(self).describe_config(self.cfg)

    @classmethod
    @abstractmethod
    def describe_config(cls, cfg: Any) -> dict[str, Any]:  # noqa: ANN401
        """The recipe fields of the judge ``cfg`` would build (cheap: no network)."""

    @classmethod
    def prompt_text(cls, cfg: Any) -> str | None:  # noqa: ANN401
        """The text whose sha256 is the recipe's ``prompt_sha256`` (None: nothing to register).

        The recipe registers it in MLflow's prompt registry, one version per sha256.
        """
        return None

    def close(self) -> None:  # noqa: B027 - optional hook: the rubric judge holds nothing
        """Release resources (idempotent)."""

    def __enter__(self) -> JudgeBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()!r})"


def short_circuit_fields(cfg: Any) -> dict[str, Any]:  # noqa: ANN401
    """The short-circuit settings as recorded in the recipe."""
    return {
        "short_circuit_no_tool_response": bool(cfg.short_circuit_no_tool_response),
        "min_reply_chars": int(cfg.min_reply_chars),
    }
