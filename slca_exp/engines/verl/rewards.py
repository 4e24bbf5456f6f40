"""HierR rewards in verl: R_tool on the last tool-segment token, R_sum on the last summary token.

verl (0.9.x) scores a finished trajectory through its reward loop and keeps one scalar, which
``AgentLoopOutput.as_dict`` writes on the last response token (``rm_scores``). SLCA-GRPO needs
two scores at two places, so two pieces work together, neither patching verl:

1. :class:`SLCARewardManager` (``reward.reward_manager.source=importlib``): decodes the whole
   multi-turn response (special tokens kept, as the local engine reads it), scores it with our
   HierR reward and judge (``slca_exp.rewards.HierRReward``, penalty routing included) and
   returns the total (``reward.process_weight * R_tool + summary_weight * R_sum``, or the
   penalty) as ``reward_score`` and the two routed scores and the total in
   ``reward_extra_info`` (:data:`TOOL_KEY`, :data:`SUMMARY_KEY`, :data:`TOTAL_KEY`, plus the tool
   components and the judge's status).
2. For our estimators, ``SLCAToolAgentLoop`` (``agent_loop.py``: verl's ``ToolAgentLoop``,
   listed in the agent-loop config written next to the verl config) returns an output whose
   ``as_dict`` rebuilds ``rm_scores`` from the two scores with :func:`place_segment_scores`.
   verl's own estimators (``grpo``) get verl's own tool agent loop instead
   (``rl_config.agent_loop``): ``rm_scores`` holds ``reward_score``, the total, on the last
   token, as verl's GRPO expects.

The estimator side (``estimators.py``, ``scores.py``) reads each score back as the sum of the
rewards over its own segment's tokens, and gets the total from ``reward_extra_info`` through
slca-exp's trainer. The segments are the response mask's runs of learnable tokens: the last run
is the summary, every earlier run the tool segment. A rollout with one run has no tool segment:
its R_tool is not written (it still counts in its total). Under the paper's rule
(``mask_rule=parity``) a rollout cut off on a tool call has its last tool turn read as the
summary; under ``mask_rule=corrected`` such a rollout (:data:`NO_SUMMARY_KEY`) has no summary:
R_tool goes on its last learnable token and its summary score is dropped; slca-exp's trainer
tells the estimator which rollouts those are.

A judge failure under ``reward.judge_failure=absent`` cannot be told apart from a score in
``rm_scores``: it is written as 0 and flagged in :data:`SUMMARY_FAILED_KEY`, and slca-exp's
trainer tells our estimators to leave that summary out of its group's normalisation, as the local
engine does (verl's own ``grpo`` reads a total of 0 for that rollout and cannot leave it out).
Every value the ``reward/*`` and ``judge/*`` metrics need travels in ``reward_extra_info`` too,
one scalar per key (:func:`reward_metrics` rebuilds the metrics from them in the trainer). So
does each rollout's 0/1 share of the paper's success@k (:func:`success_flags`): verl's validation
means them per data source (``val-aux/<source>/slca/success@k/mean@1``), the very numbers our
``val/success@k`` and ``val/tool_success@k`` are.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from omegaconf import OmegaConf

from slca_exp.core import names
from slca_exp.core.rows import Row
from slca_exp.engines.verl.keys import OUR_KEY
from slca_exp.rewards.toolcalls import ends_on_tool_call

TOOL_KEY = "slca/tool_score"
SUMMARY_KEY = "slca/summary_score"
TOTAL_KEY = "slca/total_score"
SUMMARY_FAILED_KEY = "slca/summary_failed"
TOOL_FAILED_KEY = "slca/tool_failed"
"""1 when R_tool is absent: the outcome judge could not decide (``reward.tool_reward=outcome``)."""
ENDS_ON_TOOL_KEY = "slca/ends_on_tool"
"""1 when the rollout's last assistant turn is an unanswered tool call (cut off)."""
NO_SUMMARY_KEY = "slca/no_summary"
"""1 when the rollout has no summary segment: it ends on a tool call and mask_rule=corrected."""
SUCCESS_TOTAL_KEY = "slca/success_total"
"""The total under ``reward.logged_weights`` (success@k reads it), where they are set."""

try:  # verl is an extra: the pure functions below work without it
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase as _RMBase
except ImportError:  # pragma: no cover - exercised only without the verl extra
    _RMBase = object


def place_segment_scores(
    response_mask: torch.Tensor,
    tool_score: float,
    summary_score: float,
    *,
    has_summary: bool = True,
) -> torch.Tensor:
    """(T,) float32 ``rm_scores``: R_tool on the last tool token, R_sum on the last summary one.

    A rollout without a tool segment (a single run) gets no R_tool token; one without any
    learnable token gets nothing. Non-finite scores are written as 0. ``has_summary=False``
    (the corrected mask rule, for a rollout cut off on a tool call): every learnable token is
    tool, R_tool goes on the last one and R_sum nowhere.
    """
    mask = response_mask.bool()
    scores = torch.zeros(mask.shape, dtype=torch.float32)
    positions = torch.nonzero(mask).flatten()
    if positions.numel() == 0:
        return scores
    if not has_summary:
        scores[positions[-1]] = _finite(tool_score)
        return scores
    scores[positions[-1]] = _finite(summary_score)
    # the last run starts after the last gap between learnable tokens
    gaps = torch.nonzero(positions[1:] - positions[:-1] > 1).flatten()
    if gaps.numel():
        scores[positions[gaps[-1]]] = _finite(tool_score)  # the tool segment's last token
    return scores


class SLCARewardManager(_RMBase):  # type: ignore[misc, valid-type]
    """verl reward manager: HierR tool process reward + judge, routed, for one trajectory."""

    def __init__(
        self,
        config: Any,  # noqa: ANN401 - verl's DictConfig
        tokenizer: Any,  # noqa: ANN401
        compute_score: Any = None,  # noqa: ANN401 - verl's default scorer: unused
        **kwargs: Any,  # noqa: ANN401 - reward_router_address, reward_model_tokenizer
    ) -> None:
        super().__init__(config, tokenizer, compute_score)
        from slca_exp.engines.verl.estimators import mask_rule
        from slca_exp.judges import build_judge, build_outcome_judge
        from slca_exp.rewards import HierRReward

        ours = _our_section(config)
        reward = _structured("reward", ours["reward"])
        judge = _structured("judge", ours["judge"])
        self.reward = HierRReward.from_config(reward)
        self.judge = build_judge(judge)
        self.outcome = build_outcome_judge(reward, judge)
        self.corrected = mask_rule(config.get("algorithm")) == "corrected"

    async def run_single(self, data: Any) -> dict[str, Any]:  # noqa: ANN401 - a DataProto
        """Score the last sequence of ``data`` (one trajectory); verl's reward-loop contract."""
        item = data[-1]
        responses = item.batch["responses"]
        length = int(item.batch["attention_mask"][-responses.shape[-1] :].sum())
        text = self.tokenizer.decode(responses[:length].tolist(), skip_special_tokens=False)
        row = Row(item.non_tensor_batch)  # the row's columns travel with the item
        truth = row.truth()
        recorded = [row.recorded()] if self.outcome is not None else None
        loop = asyncio.get_running_loop()
        scored = await loop.run_in_executor(
            None,
            lambda: self.reward.score(
                [text], [truth], self.judge, outcome=self.outcome, recorded=recorded
            ),
        )
        return _result(
            scored, ends_on_tool_call(text), corrected=self.corrected, reward=self.reward
        )


def _result(
    scored: Any,  # noqa: ANN401 - a RewardBatch of one
    ends_on_tool: bool,
    *,
    corrected: bool,
    reward: Any,  # noqa: ANN401 - the HierRReward that scored it (its weights)
) -> dict[str, Any]:
    """The reward result verl keeps for one rollout (from a ``RewardBatch`` of one)."""
    tool = float(scored.scores.tool[0])
    summary = float(scored.scores.summary[0])
    total = float(scored.scores.total[0])
    raw_tool, judged = scored.tool[0], scored.summary[0]
    info: dict[str, Any] = {
        TOOL_KEY: _finite(tool),
        SUMMARY_KEY: _finite(summary),
        TOTAL_KEY: _finite(total),
        SUMMARY_FAILED_KEY: int(not math.isfinite(summary)),
        TOOL_FAILED_KEY: int(not math.isfinite(tool)),
        ENDS_ON_TOOL_KEY: int(ends_on_tool),
        NO_SUMMARY_KEY: int(ends_on_tool and corrected),
        "slca/tool/score": float(raw_tool.score),  # NaN: absent (the outcome judge failed)
        "slca/tool/hierr": float(scored.hierr[0].score if scored.hierr else raw_tool.score),
        "slca/tool/should_no_call": int(raw_tool.should_no_call),
        "slca/judge/score": float(judged.score),  # NaN: absent (failed under `absent`)
        "slca/judge/rating": _rating(judged.rating),
        "slca/judge/raw_rating": _rating(judged.judge_rating),
        "slca/judge_status": str(judged.status),
        "slca/judge_reason": str(judged.reason),
        "slca/judge/cached": int(judged.cached),
        "slca/judge/latency_ms": float(judged.latency_ms),
    }
    for name, value in raw_tool.components.items():
        info[f"slca/tool/{name}"] = float(value)
    if scored.outcome:  # reward.tool_reward=outcome: the verdict, one scalar per key
        decided = scored.outcome[0]
        info.update(
            {
                OUTCOME_KEY: -1 if decided is None else _VERDICT_CODE.get(decided.verdict, -1),
                "slca/outcome/status": "" if decided is None else str(decided.status),
                "slca/outcome/reason": "" if decided is None else str(decided.reason),
                "slca/outcome/fallback": int(decided is not None and decided.fallback),
                "slca/outcome/cached": int(decided is not None and decided.cached),
                "slca/outcome/latency_ms": 0.0 if decided is None else float(decided.latency_ms),
            }
        )
    if scored.evaluated is not None:  # reward.logged_weights: success@k under them
        info[SUCCESS_TOTAL_KEY] = float(scored.evaluated.total[0])
    weights = {"process_weight": reward.process_weight, "summary_weight": reward.summary_weight}
    info.update(success_flags(info, **weights))
    return {"reward_score": _finite(total), "reward_extra_info": info}


OUTCOME_KEY = "slca/outcome/verdict"
"""The outcome judge's verdict as a number: 1 Solved, 0 Unsolved, 2 Unsure, -1 none."""
_VERDICT_CODE = {"Solved": 1, "Unsolved": 0, "Unsure": 2, None: -1}
_VERDICT_NAME = {code: verdict for verdict, code in _VERDICT_CODE.items()}


def verdict_of(info: Mapping[str, Any]) -> str | None:
    """The outcome verdict a ``reward_extra_info`` row holds (``None``: none)."""
    return _VERDICT_NAME.get(int(info.get(OUTCOME_KEY, -1)))


def _rating(value: int | None) -> int:
    """A rating as verl keeps it: ``-1`` for none (its extra-info columns are numeric)."""
    return -1 if value is None else int(value)


def _read_rating(info: Mapping[str, Any], key: str) -> int | None:
    value = int(info.get(key, -1))
    return None if value < 0 else value


def batch_infos(extra_fields: Sequence[Any]) -> list[Mapping[str, Any]]:
    """Each rollout's ``reward_extra_info`` from its TransferQueue ``extra_fields`` ({} if none)."""
    infos = []
    for fields in extra_fields:
        info = fields.get("reward_extra_info") if isinstance(fields, Mapping) else None
        infos.append(info if isinstance(info, Mapping) else {})
    return infos


def reward_metrics(infos: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The ``reward/*``, ``judge/*`` (and ``outcome/*``) metrics of a batch.

    The same numbers the local engine logs (``slca_exp.rewards.routing.reward_stats``,
    ``outcome_stats`` and ``slca_exp.rewards.summary.judge_stats``), rebuilt from what
    :class:`SLCARewardManager` wrote for each rollout. Rows without our keys (another reward
    manager) are skipped.
    """
    from slca_exp.estimators import RolloutScores
    from slca_exp.rewards.routing import outcome_stats, reward_stats
    from slca_exp.rewards.summary import judge_stats

    rows = [info for info in infos if info and TOOL_KEY in info]
    if not rows:
        return {}
    tools, hierr = tool_rewards(rows)
    summaries = [_summary(r) for r in rows]
    scores = RolloutScores(tool=[], summary=[], total=torch.tensor(scored_totals(rows)))
    stats = reward_stats(tools, summaries, scores, hierr=hierr) | judge_stats(summaries)
    if all(OUTCOME_KEY in r for r in rows):
        stats |= outcome_stats([_outcome(r) for r in rows])
    return {key: value for key, value in stats.items() if math.isfinite(value)}


def scored_totals(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """Each row's total as the estimators use it: NaN where a judge left a segment absent.

    ``rm_scores`` holds 0 for a summary (one the rollout has) or an R_tool that could not be
    scored; the total of such a rollout is not a score.
    """
    return [
        math.nan
        if (r.get(SUMMARY_FAILED_KEY) and not r.get(NO_SUMMARY_KEY)) or r.get(TOOL_FAILED_KEY)
        else float(r[TOTAL_KEY])
        for r in rows
    ]


def success_totals(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """Each row's total as success@k reads it.

    :func:`scored_totals`, or the total under ``reward.logged_weights`` where the reward side
    recorded one (:data:`SUCCESS_TOTAL_KEY`).
    """
    return [
        float(r[SUCCESS_TOTAL_KEY]) if SUCCESS_TOTAL_KEY in r else total
        for r, total in zip(rows, scored_totals(rows), strict=True)
    ]


def hierr_score(info: Mapping[str, Any]) -> float:
    """A row's HierR tool process score (R_tool itself where no outcome judge replaced it)."""
    return float(info.get("slca/tool/hierr", info["slca/tool/score"]))


def success_key(name: str) -> str:
    """The ``reward_extra_info`` key of one rollout's share of ``val/success@k`` (or tool_...).

    >>> success_key("val/success@0.9"), success_key("val/tool_success@1.0")
    ('slca/success@0.9', 'slca/tool_success@1.0')

    """
    return "slca/" + name.removeprefix(names.VAL_PREFIX)


def success_flags(
    info: Mapping[str, Any], *, process_weight: float = 1.0, summary_weight: float = 1.0
) -> dict[str, int]:
    """One rollout's 0/1 of each ``val/success@k`` and ``val/tool_success@k`` (:func:`success_key`).

    ``slca_exp.rewards.routing.success_stats`` of a batch of this one row, so that the mean of a
    flag over a validation pass is that metric: a rollout with an absent segment (its total is
    NaN, :func:`scored_totals`) is no success, and still counts in the mean.
    """
    from slca_exp.rewards.routing import success_stats

    weights = {"process_weight": process_weight, "summary_weight": summary_weight}
    stats = success_stats(success_totals([info]), [hierr_score(info)], **weights)
    return {success_key(name): int(value) for name, value in stats.items()}


def tool_rewards(rows: Sequence[Mapping[str, Any]]) -> tuple[list[Any], list[Any]]:
    """Each row's R_tool and its HierR tool process reward, as ``ToolReward`` objects."""
    from slca_exp.rewards.hierr import COMPONENTS, ToolReward

    tools, hierr = [], []
    for r in rows:
        components = {part: float(r[f"slca/tool/{part}"]) for part in COMPONENTS}
        no_call = int(r["slca/tool/should_no_call"])
        score = float(r["slca/tool/score"])
        tools.append(ToolReward(score=score, components=components, should_no_call=no_call))
        matched = hierr_score(r)
        hierr.append(ToolReward(score=matched, components=components, should_no_call=no_call))
    return tools, hierr


def _summary(r: Mapping[str, Any]) -> Any:  # noqa: ANN401 - a SummaryReward
    from slca_exp.rewards.summary import SummaryReward

    return SummaryReward(
        score=float(r["slca/judge/score"]),
        rating=_read_rating(r, "slca/judge/rating"),
        raw_rating=_read_rating(r, "slca/judge/raw_rating"),
        status=str(r["slca/judge_status"]),
        cached=bool(r["slca/judge/cached"]),
        latency_ms=float(r["slca/judge/latency_ms"]),
    )


def _outcome(r: Mapping[str, Any]) -> Any:  # noqa: ANN401 - an OutcomeResult or None
    from slca_exp.rewards.judging import OutcomeResult

    status = str(r.get("slca/outcome/status", ""))
    if not status:
        return None  # not asked (a penalised no-call)
    verdict = verdict_of(r)
    return OutcomeResult(
        verdict=verdict,
        score=math.nan if verdict is None else float(verdict == "Solved"),
        status=status,
        reason=str(r.get("slca/outcome/reason", "")),
        fallback=bool(r.get("slca/outcome/fallback", 0)),
        cached=bool(r.get("slca/outcome/cached", 0)),
        latency_ms=float(r.get("slca/outcome/latency_ms", 0.0)),
    )


def _our_section(config: Any) -> Mapping[str, Any]:  # noqa: ANN401
    section = config.get(OUR_KEY) if hasattr(config, "get") else None
    if not section or "reward" not in section or "judge" not in section:
        raise KeyError(
            f"the verl config has no `{OUR_KEY}` section with `reward` and `judge`: the reward "
            "manager reads them there (slca-exp writes it when it translates a run config)"
        )
    return section


def _structured(group: str, values: Any) -> Any:  # noqa: ANN401
    """Our dataclass config of ``group`` (``judge``, ``reward``) from a plain mapping."""
    from slca_exp.config.schema import RewardConfig
    from slca_exp.config.services import JudgeConfig

    schema = {"judge": JudgeConfig, "reward": RewardConfig}[group]
    plain = OmegaConf.to_container(values, resolve=True) if OmegaConf.is_config(values) else values
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), plain))


def _finite(value: float) -> float:
    return float(value) if math.isfinite(value) else 0.0
