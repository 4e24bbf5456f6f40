"""The rubric judge: a deterministic, model-free stand-in for the paper's frozen LLM judge.

It exists so that a recipe runs end to end on a laptop CPU; its ratings are NOT comparable with
the paper's GPT-OSS-120B judge, and runs record ``backend: rubric`` with the rule's version as
``prompt_version`` and the hash of its constants as ``prompt_sha256`` (so the recipe fingerprint
tells the rules apart). It sees what the LLM judge sees: the question, the tool responses and the
final reply. Under ``reward.judge_view=interaction`` (``reward=hierr_v82``) it rates the reply
v8.2's rule reads, from the same tool responses: the rule has no use for the tool calls, and it
renders no template (``reward.judge_prompt`` does not apply to it). Whether a rollout without a
tool response is rated is the reward's ``no_tool_response``, as for any judge.

``judge.rubric_version`` picks the rule:

- ``v2`` (the default): a reply is rated on what it states (:mod:`slca_exp.judges.rubric_v2`);
- ``v1``: the first rule (:mod:`slca_exp.judges.rubric`), so that runs made with it reproduce
  their ratings exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from slca_exp.judges.base import (
    JudgeBase,
    JudgeRequest,
    JudgeResult,
    JudgeView,
    short_circuit_fields,
)
from slca_exp.judges.rubric import RULE_V1, rubric_rating
from slca_exp.judges.rubric_v2 import PARAMS_V2, RUBRIC_V2, rubric_v2_rating
from slca_exp.rewards.judging import LABELS
from slca_exp.services.cache import cache_key, canonical_json


def _v1(view: JudgeView) -> tuple[int, str]:
    rating = rubric_rating(view)
    return rating, LABELS[rating - 1]


RUBRIC_VERSIONS: dict[str, tuple[dict[str, Any], Callable[[JudgeView], tuple[int, str]]]] = {
    "v1": (RULE_V1, _v1),
    "v2": ({"rubric": RUBRIC_V2, "params": PARAMS_V2}, rubric_v2_rating),
}
"""``judge.rubric_version`` -> (what the recipe records of the rule, the rule: view -> rating,
reason)."""


def rubric_verdict(view: JudgeView, version: str = "v2") -> tuple[int, str]:
    """The rating (1-5) and reason the rubric rule ``version`` gives one rollout.

    >>> view = JudgeView("Weather in Paris?", ('{"city": "Paris", "temp_c": 21.4}',),
    ...                  '{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>')
    >>> rubric_verdict(view, "v1"), rubric_verdict(view, "v2")
    ((5, 'excellent'), (1, 'very poor: not a summary (tool-call markup)'))

    Raises:
        KeyError: ``version`` is not one of :data:`RUBRIC_VERSIONS`.

    """
    return RUBRIC_VERSIONS[version][1](view)


class RubricJudge(JudgeBase):
    """The deterministic CPU judge (registry name ``rubric``); see the module docstring."""

    name = "rubric"
    remote = False
    views = ("responses", "interaction")

    def __init__(self, cfg: Any) -> None:  # noqa: ANN401
        super().__init__(cfg)
        self.version = _version(cfg)
        self._rule = RUBRIC_VERSIONS[self.version][1]

    async def ascore(self, batch: Sequence[JudgeRequest]) -> list[JudgeResult]:
        """Rate a batch (pure CPU: the same as :meth:`score`)."""
        return self.score(batch)

    def score(self, batch: Sequence[JudgeRequest]) -> list[JudgeResult]:
        """Rate a batch; never raises on any text."""
        results = []
        for request in batch:
            view = JudgeView.of(request)
            results.append(self._short_circuit(view, request) or self._rate(view))
        return self._count(results)

    def _rate(self, view: JudgeView) -> JudgeResult:
        try:
            rating, reason = self._rule(view)
        except (ValueError, OverflowError, RecursionError, MemoryError) as exc:
            # The rules are total on strings; this only guards against the unforeseen.
            return JudgeResult.failed(f"rubric error: {type(exc).__name__}")
        return JudgeResult.rated(rating, reason=reason)

    @classmethod
    def describe_config(cls, cfg: Any) -> dict[str, Any]:  # noqa: ANN401
        """Backend, the rule's version and the hash of its constants, short-circuit settings."""
        rule = RUBRIC_VERSIONS[_version(cfg)][0]
        return {
            "backend": "rubric",
            "name": cfg.name,
            "model": None,
            "prompt_version": rule["rubric"],
            "prompt_sha256": cache_key(rule),
            "temperature": None,
            "max_tokens": None,
            **short_circuit_fields(cfg),
            "stand_in": "deterministic rubric, not the paper's LLM judge",
        }

    @classmethod
    def prompt_text(cls, cfg: Any) -> str:  # noqa: ANN401
        """The rule's version and constants as canonical JSON (what ``prompt_sha256`` hashes)."""
        return canonical_json(RUBRIC_VERSIONS[_version(cfg)][0])


def _version(cfg: Any) -> str:  # noqa: ANN401
    """``judge.rubric_version`` (``v2`` when the config has no such key, e.g. a plugin's)."""
    version = str(getattr(cfg, "rubric_version", None) or "v2")
    if version not in RUBRIC_VERSIONS:
        known = ", ".join(RUBRIC_VERSIONS)
        raise ValueError(f"judge.rubric_version: {version!r} is not one of {known}")
    return version
