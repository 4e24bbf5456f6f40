"""Summary judges: a deterministic CPU rubric and an LLM over an OpenAI-compatible server.

Build one from the ``judge`` config with :func:`build_judge`; :func:`describe_judge` gives the
fields the recipe records without building anything (no network, no cache file).

Example:
    >>> from slca_exp.config.services import JudgeConfig
    >>> judge = build_judge(JudgeConfig())
    >>> [r.status for r in judge.score([JudgeRequest("q?", "no tools, just an answer")])]
    ['short_circuit']

"""

from __future__ import annotations

from typing import Any

from slca_exp.judges.base import (
    LABELS,
    VIEW_FIELDS,
    Judge,
    JudgeBase,
    JudgeRequest,
    JudgeResult,
    JudgeView,
    batch_stats,
)
from slca_exp.judges.llm import OpenAIJudge, parse_rating
from slca_exp.judges.noise import NoisyJudge, noise_fields
from slca_exp.judges.outcome import (
    OUTCOME_JUDGES,
    OutcomeJudgeBase,
    outcome_backend,
    parse_verdict,
)
from slca_exp.judges.rubric_judge import RUBRIC_VERSIONS, RubricJudge, rubric_verdict
from slca_exp.registry import Registry
from slca_exp.services.prompts import PromptTemplate

JUDGES: Registry[type[JudgeBase]] = Registry("judge")
"""Judge backends, keyed by ``judge.backend``: ``JudgeBase`` subclasses, ``cls(cfg)`` builds one
from a ``judge`` config and ``cls.remote`` says whether it asks a server. Plugins
(``SLCA_EXP_PLUGINS``) register their own."""
JUDGES.register("rubric", RubricJudge)
JUDGES.register("openai", OpenAIJudge)


def build_judge(cfg: Any, *, seed: int = 0) -> Judge:  # noqa: ANN401
    """The judge a ``judge`` config describes (``cfg.backend`` picks the registry entry).

    With ``judge.noise.kind`` other than ``none`` the judge is wrapped in a
    :class:`~slca_exp.judges.noise.NoisyJudge`; ``seed`` (the run's) seeds its draws unless
    ``judge.noise.seed`` is set.

    Raises:
        UnknownNameError: no judge is registered under ``cfg.backend``.
        FileNotFoundError: ``judge.prompt`` names no template.

    """
    judge = JUDGES.get(cfg.backend)(cfg)
    noise = _noise(cfg)
    if noise is None or noise.kind == "none":
        return judge
    return NoisyJudge(judge, noise, seed)


def describe_judge(cfg: Any) -> dict[str, Any]:  # noqa: ANN401
    """The recipe fields of the judge ``cfg`` describes (cheap: no network, no cache).

    ``noise`` is added only when ``judge.noise`` is on, so a recipe without it keeps the
    fingerprint it always had.
    """
    fields = JUDGES.get(cfg.backend).describe_config(cfg)
    noise = noise_fields(_noise(cfg))
    return fields if noise is None else {**fields, "noise": noise}


def describe_judging(reward: Any) -> dict[str, Any] | None:  # noqa: ANN401
    """What a ``reward`` config asks of the summary judge, as the recipe should record it.

    ``None`` for the main reward's asks (``judge_view=responses``, no ``judge_prompt``,
    ``no_tool_response=zero``), so that a recipe without them keeps its fingerprint; otherwise
    the view, the rule, and the template with its version and sha256 (cheap: no network).

    >>> from slca_exp.config.schema import RewardConfig
    >>> describe_judging(RewardConfig()) is None
    True
    >>> v82 = describe_judging(RewardConfig(judge_view="interaction",
    ...     judge_prompt="hierr_judge_v82.txt", no_tool_response="judge"))
    >>> v82["judge_view"], v82["judge_prompt_version"], len(v82["judge_prompt_sha256"])
    ('interaction', 'hierr_judge_v82', 64)

    Raises:
        FileNotFoundError: ``reward.judge_prompt`` names no template.

    """
    get = reward.get if hasattr(reward, "get") else lambda k: getattr(reward, k, None)
    view, prompt = str(get("judge_view") or "responses"), get("judge_prompt")
    rule = str(get("no_tool_response") or "zero")
    if (view, prompt, rule) == ("responses", None, "zero"):
        return None
    fields: dict[str, Any] = {"judge_view": view, "no_tool_response": rule, "judge_prompt": None}
    if prompt:
        template = PromptTemplate.load(str(prompt), "judge")
        fields |= {
            "judge_prompt": template.path.name,
            "judge_prompt_version": get("judge_prompt_version") or template.path.stem,
            "judge_prompt_sha256": template.sha256,
        }
    return fields


def outcome_judge_class(reward: Any, judge: Any) -> type[OutcomeJudgeBase]:  # noqa: ANN401
    """The outcome judge backend the configs pick (``auto``: openai beside a served judge).

    Raises:
        UnknownNameError: no outcome judge is registered under that name.

    """
    remote = judge.backend in JUDGES and bool(JUDGES.get(judge.backend).remote)
    return OUTCOME_JUDGES.get(outcome_backend(reward.outcome, remote))


def build_outcome_judge(reward: Any, judge: Any) -> OutcomeJudgeBase | None:  # noqa: ANN401
    """The outcome judge of ``reward.tool_reward=outcome`` (``None`` under ``hierr``).

    It asks the summary judge's server (``judge``) when its backend asks one.
    """
    if reward.tool_reward != "outcome":
        return None
    return outcome_judge_class(reward, judge)(reward.outcome, judge)


def describe_outcome(reward: Any, judge: Any) -> dict[str, Any] | None:  # noqa: ANN401
    """The recipe fields of the outcome judge (``None`` under ``hierr``; no network)."""
    if reward.tool_reward != "outcome":
        return None
    return outcome_judge_class(reward, judge).describe_config(reward.outcome, judge)


def outcome_prompts(reward: Any, judge: Any) -> dict[str, str]:  # noqa: ANN401
    """Role -> the outcome judge's texts for the prompt registry (``{}`` under ``hierr``)."""
    if reward.tool_reward != "outcome":
        return {}
    return outcome_judge_class(reward, judge).prompt_texts(reward.outcome, judge)


def _noise(cfg: Any) -> Any:  # noqa: ANN401 - a judge.noise config, or None (a plugin's config)
    return cfg.get("noise") if hasattr(cfg, "get") else getattr(cfg, "noise", None)


__all__ = [
    "JUDGES",
    "OUTCOME_JUDGES",
    "LABELS",
    "RUBRIC_VERSIONS",
    "Judge",
    "JudgeRequest",
    "JudgeResult",
    "JudgeView",
    "NoisyJudge",
    "OpenAIJudge",
    "RubricJudge",
    "VIEW_FIELDS",
    "batch_stats",
    "build_judge",
    "build_outcome_judge",
    "describe_judge",
    "describe_judging",
    "describe_outcome",
    "outcome_judge_class",
    "outcome_prompts",
    "parse_rating",
    "parse_verdict",
    "rubric_verdict",
]
