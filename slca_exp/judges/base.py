"""What every judge shares: the paper's short-circuits, the batch metrics, the base class.

The protocol a judge implements, its requests and its results are the summary reward's
(:mod:`slca_exp.rewards.judging`, re-exported here for the judges).

A judge rates the final reply of a rollout 1-5 from what the reward shows it
(``JudgeRequest.view``, the recipe's ``reward.judge_view``): under ``responses`` the question, the
numbered ``<tool_response>`` contents and the text after the last ``</tool_response>``; under
``interaction`` the question, every tool call and tool response, and the reply, as the public
v8.2 reward showed them (:mod:`slca_exp.judges.interaction`). The summary score is
``(rating - 1) / 4``. A judge never invents a score: when it cannot rate, the result is
``status="failed"`` with ``score=NaN`` and the reward's failure policy decides what that means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slca_exp.core import names
from slca_exp.judges.interaction import as_decoded, final_response, tool_interactions
from slca_exp.rewards.judging import LABELS, STATUSES, Judge, JudgeRequest, JudgeResult
from slca_exp.rewards.toolcalls import final_reply, tool_responses
from slca_exp.services.backend import Backend, Counted

__all__ = [
    "LABELS",
    "STATUSES",
    "Judge",
    "JudgeBase",
    "JudgeRequest",
    "JudgeResult",
    "JudgeView",
    "VIEW_FIELDS",
    "batch_stats",
    "short_circuit",
    "short_circuit_fields",
]


VIEW_FIELDS: dict[str, tuple[str, ...]] = {
    "responses": ("question", "tool_responses", "reply"),
    "interaction": ("question", "tool_interactions", "reply"),
}
"""The ``{{...}}`` fields each view fills in a judge's template (a template may use no others);
its keys are ``rewards.judging.JUDGE_VIEWS``."""


@dataclass(frozen=True)
class JudgeView:
    """What a judge sees of a rollout.

    Attributes:
        question: the user's question.
        tool_responses: the stripped ``<tool_response>`` contents, in order.
        reply: the final reply (under ``interaction``, by the v8.2 rule).
        tool_interactions: under ``interaction``, every tool call and tool response as v8.2
            rendered them; ``""`` under ``responses``.
        kind: the view, ``responses`` or ``interaction`` (a key of :data:`VIEW_FIELDS`).

    """

    question: str
    tool_responses: tuple[str, ...]
    reply: str
    tool_interactions: str = ""
    kind: str = "responses"

    @classmethod
    def of(cls, request: JudgeRequest) -> JudgeView:
        """Extract the view ``request.view`` names (linear scans, see ``rewards.toolcalls``)."""
        text = request.response_text
        if request.view == "interaction":
            return cls(
                request.question,
                tuple(tool_responses(as_decoded(text))),
                final_response(text),
                tool_interactions(text),
                "interaction",
            )
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
    """The judge metrics of one batch, named as in ``core/names.py``.

    ``judge/requests`` counts the requests that needed the judge (not short-circuited),
    ``judge/failures`` the failed ones; ``judge/cache_hit_frac`` and ``judge/latency_ms`` are
    over the requests: the fraction answered from the cache, and the mean latency of those that
    were not (0.0 when there are none).
    """
    asked = [r for r in results if r.status != "short_circuit"]
    served = [r.latency_ms for r in asked if not r.cached]
    return {
        names.JUDGE_REQUESTS: float(len(asked)),
        names.JUDGE_FAILURES: float(sum(r.status == "failed" for r in results)),
        names.JUDGE_CACHE_HIT_FRAC: sum(r.cached for r in asked) / len(asked) if asked else 0.0,
        names.JUDGE_LATENCY_MS: sum(served) / len(served) if served else 0.0,
    }


class JudgeBase(Counted, Backend):
    """Shared plumbing: the config's short-circuits, counters and the context manager.

    Its counters: requests, short_circuits, cache_hits, failures.

    A judge backend is a subclass registered in ``slca_exp.judges.JUDGES`` under the name
    ``judge.backend`` picks; ``cls(cfg)`` builds it from the ``judge`` config.
    """

    STATUS_COUNTERS = {"short_circuit": "short_circuits", "failed": "failures"}
    remote: bool = False
    """Whether the judge asks a server: then validation requires ``judge.model`` and
    ``judge.base_url``, and ``validate`` / ``--dry-run`` probe that URL (unless ``--offline``)."""
    views: tuple[str, ...] = ("responses",)
    """The views (``reward.judge_view``) the judge honours; validation refuses any other."""

    def __init__(self, cfg: Any) -> None:  # noqa: ANN401
        super().__init__()
        self.cfg = cfg

    @classmethod
    def template_fields(cls, cfg: Any, prompt: str | None = None) -> tuple[str, ...] | None:  # noqa: ANN401
        """The ``{{...}}`` fields of the template the judge renders (``None``: it renders none).

        Args:
            cfg: the ``judge`` config.
            prompt: the reward's template (``reward.judge_prompt``), which wins over the judge's.

        Raises:
            FileNotFoundError: the template does not exist.

        """
        return None

    def _short_circuit(self, view: JudgeView, request: JudgeRequest) -> JudgeResult | None:
        return short_circuit(
            view,
            request,
            no_tool_response=bool(self.cfg.short_circuit_no_tool_response),
            min_reply_chars=int(self.cfg.min_reply_chars),
        )


def short_circuit_fields(cfg: Any) -> dict[str, Any]:  # noqa: ANN401
    """The short-circuit settings as recorded in the recipe."""
    return {
        "short_circuit_no_tool_response": bool(cfg.short_circuit_no_tool_response),
        "min_reply_chars": int(cfg.min_reply_chars),
    }
