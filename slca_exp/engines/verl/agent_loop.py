"""Our agent loop in verl: verl's tool agent loop whose output carries both segment scores.

    verl's ``ToolAgentLoop.run``                     (unchanged: generation, tool calls, reward)
      -> AgentLoopOutput, ``reward_extra_info`` from ``SLCARewardManager`` (``rewards.py``)
      -> as_segment_scored: a :class:`SegmentScoredOutput`
      -> its ``as_dict``: ``rm_scores`` rebuilt with ``place_segment_scores``: R_tool on the
         last tool-segment token, R_sum on the last summary token (``rewards.py``)

verl keeps one scalar per trajectory and writes it on the last response token; our estimators
need the two scores at their segments' ends, and only the output's type changes for that. verl
finds the loop by name (:data:`AGENT_NAME`) in the agent-loop config :func:`agent_loop_config`
writes next to the verl config; verl's own estimators (``grpo``) get verl's own loop instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from slca_exp.engines.verl.rewards import (
    NO_SUMMARY_KEY,
    SUMMARY_KEY,
    TOOL_KEY,
    place_segment_scores,
)

AGENT_NAME = "slca_tool_agent"
"""The agent loop's name in verl (``actor_rollout_ref.rollout.agent.default_agent_loop``)."""

try:  # verl is an extra: this module imports without it
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput as _OutputBase
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop as _LoopBase
except ImportError:  # pragma: no cover - exercised only without the verl extra
    _OutputBase = _LoopBase = object


class SegmentScoredOutput(_OutputBase):  # type: ignore[misc, valid-type]
    """An agent-loop output whose ``rm_scores`` carry the two segment scores."""

    def as_dict(self) -> dict[str, Any]:
        """The dict verl stores, with ``rm_scores`` rebuilt from the two segment scores."""
        out = super().as_dict()
        info = (out.get("extra_fields") or {}).get("reward_extra_info") or {}
        if TOOL_KEY in info and SUMMARY_KEY in info:
            out["rm_scores"] = place_segment_scores(
                out["response_mask"],
                float(info[TOOL_KEY]),
                float(info[SUMMARY_KEY]),
                has_summary=not info.get(NO_SUMMARY_KEY),
            )
        return out


class SLCAToolAgentLoop(_LoopBase):  # type: ignore[misc, valid-type]
    """verl's multi-turn tool agent loop, returning :class:`SegmentScoredOutput`."""

    async def run(
        self,
        sampling_params: dict[str, Any],
        priority: int = 0,
        **kwargs: Any,  # noqa: ANN401
    ) -> SegmentScoredOutput:
        """Run verl's loop unchanged; only the output's type changes."""
        output = await super().run(sampling_params, priority, **kwargs)
        return as_segment_scored(output)


def as_segment_scored(output: Any) -> SegmentScoredOutput:  # noqa: ANN401
    """The same output as a :class:`SegmentScoredOutput` (the fields that were set stay set)."""
    return SegmentScoredOutput.model_validate(output.model_dump(exclude_unset=True))


def agent_loop_config(path: str | Path) -> Path:
    """Write verl's agent-loop config listing :class:`SLCAToolAgentLoop` as :data:`AGENT_NAME`.

    Point ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` at it and set
    ``default_agent_loop`` to :data:`AGENT_NAME`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    target = f"{SLCAToolAgentLoop.__module__}.{SLCAToolAgentLoop.__qualname__}"
    path.write_text(OmegaConf.to_yaml([{"name": AGENT_NAME, "_target_": target}]))
    return path
