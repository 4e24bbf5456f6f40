"""Summary judges: a deterministic CPU rubric and an LLM over an OpenAI-compatible server.

Build one from the ``judge`` config with :func:`build_judge`; :func:`describe_judge` gives the
fields the recipe records without building anything (no network, no cache file).

Example:
    >>> from slca_exp.config.schema import JudgeConfig
    >>> judge = build_judge(JudgeConfig())
    >>> [r.status for r in judge.score([JudgeRequest("q?", "no tools, just an answer")])]
    ['short_circuit']

"""

from __future__ import annotations

from typing import Any

from slca_exp.judges.base import (
    LABELS,
    Judge,
    JudgeBase,
    JudgeRequest,
    JudgeResult,
    JudgeView,
    batch_stats,
)
from slca_exp.judges.llm import OpenAIJudge, parse_rating
from slca_exp.judges.rubric import RUBRIC_VERSION, RubricJudge
from slca_exp.registry import Registry

JUDGES: Registry[type[JudgeBase]] = Registry("judge")
"""Judge backends, keyed by ``judge.backend``: ``JudgeBase`` subclasses, ``cls(cfg)`` builds one
from a ``judge`` config and ``cls.remote`` says whether it asks a server. Plugins
(``SLCA_EXP_PLUGINS``) register their own."""
JUDGES.register("rubric", RubricJudge)
JUDGES.register("openai", OpenAIJudge)


def build_judge(cfg: Any) -> Judge:  # noqa: ANN401
    """The judge a ``judge`` config describes (``cfg.backend`` picks the registry entry).

    Raises:
        UnknownNameError: no judge is registered under ``cfg.backend``.
        FileNotFoundError: ``judge.prompt`` names no template.

    """
    return JUDGES.get(cfg.backend)(cfg)


def describe_judge(cfg: Any) -> dict[str, Any]:  # noqa: ANN401
    """The recipe fields of the judge ``cfg`` describes (cheap: no network, no cache)."""
    return JUDGES.get(cfg.backend).describe_config(cfg)


__all__ = [
    "JUDGES",
    "LABELS",
    "RUBRIC_VERSION",
    "Judge",
    "JudgeRequest",
    "JudgeResult",
    "JudgeView",
    "OpenAIJudge",
    "RubricJudge",
    "batch_stats",
    "build_judge",
    "describe_judge",
    "parse_rating",
]
