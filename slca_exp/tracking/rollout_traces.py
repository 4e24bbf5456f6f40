"""A rollout record as an MLflow trace linked to its run.

    RolloutRecord -> trace (in the run's experiment, linked to the run: ``search_traces(run_id=)``)
      root span   AGENT       inputs: the prompt and the row's tools; outputs: the summary;
                              attributes: the reward parts, the segment advantages, token counts
      per assistant turn      CHAT_MODEL: its text, token count, segment
      per tool call           TOOL: inputs name and arguments; outputs the simulator's answer,
                              the simulator, its status and whether it came from the cache
      trace tags              step, split, group, sample, rank, algorithm, seed, engine
      assessments             feedback: the rewards, the judge's rating and status, the
                              advantages (:data:`FEEDBACK`): columns of the Traces tab, and
                              ``search_traces(filter_string="feedback.reward_tool > 0.5")``

Every name a trace carries is defined here once (:data:`TAGS`, :data:`ROOT_NUMBERS`, ...): both
engines' traces carry the same names, and the engine-parity test compares them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slca_exp.core.names import TOOL_COMPONENTS
from slca_exp.core.tags import ESTIMATOR, JUDGE, REWARD, SIMULATOR
from slca_exp.rollouts.record import finite_or_none

if TYPE_CHECKING:
    from slca_exp.rollouts.record import RolloutRecord

TAG_STEP = "slca.step"
TAG_SPLIT = "slca.split"
TAG_GROUP = "slca.group"
TAG_SAMPLE = "slca.sample"
TAG_RANK = "slca.rank"
TAG_ALGORITHM = "slca.algorithm"
TAG_SEED = "slca.seed"
TAG_ENGINE = "slca.engine"
TAGS = (TAG_STEP, TAG_SPLIT, TAG_GROUP, TAG_SAMPLE, TAG_RANK, TAG_ALGORITHM, TAG_SEED, TAG_ENGINE)
"""Trace tags: what the Traces tab and ``search_traces(filter_string=...)`` filter on."""

ROOT_NUMBERS = (
    "slca.reward.tool",
    "slca.reward.tool.format",
    "slca.reward.tool.name",
    "slca.reward.tool.key",
    "slca.reward.tool.value",
    "slca.reward.tool.parallel",
    "slca.reward.summary",
    "slca.reward.rating",
    "slca.reward.raw_rating",
    "slca.reward.routed_tool",
    "slca.reward.routed_summary",
    "slca.reward.total",
    "slca.reward.hierr",
    "slca.adv.tool",
    "slca.adv.summary",
    "slca.tokens.tool",
    "slca.tokens.summary",
    "slca.tokens.env",
    "slca.drift.tokens",
    "slca.drift.first",
)
"""Numbers on the root span (absent when the value is unknown: a failed judge has no rating,
a validation rollout no advantage, a rollout without a tool segment no tool advantage)."""
CONDITIONAL = frozenset(
    {
        "slca.adv.tool",
        "slca.adv.summary",
        "slca.reward.rating",
        "slca.reward.raw_rating",
        "slca.reward.summary",
        "slca.reward.routed_summary",
        "slca.reward.total",
        "slca.reward.hierr",
        "slca.reward.outcome",
        "slca.judge.reason",
        "slca.cached",
        "slca.drift.first",
        "slca.drift.where",
        "slca.drift.expected",
        "slca.drift.found",
    }
)
"""Names a span carries only where the value is known (see :data:`ROOT_NUMBERS`)."""
ROOT_FLAGS = ("slca.ends_on_tool_call", "slca.should_no_call")
ROOT_TEXT = ("slca.judge.status", "slca.judge.reason", "slca.reward.outcome")
DRIFT_TEXT = ("slca.drift.where", "slca.drift.expected", "slca.drift.found")
"""Where the first token drift is and the texts there (``rollouts.drift``), when there is one:
``slca.drift.tokens`` counts the differing tokens, ``slca.drift.first`` is the first one's
response position."""
TURN_ATTRIBUTES = ("slca.turn", "slca.segment", "slca.tokens")
TOOL_ATTRIBUTES = ("slca.turn", SIMULATOR, "slca.status", "slca.cached")
"""A TOOL span's attributes (the simulator under the run tag's name: ``slca.simulator``)."""

# The Traces tab shows the first five assessment names in alphabetical order as columns at
# first (the others from its Columns menu): the advantages, the rating and the tool reward.
FEEDBACK_TOOL = "reward_tool"
FEEDBACK_PARTS = tuple(f"tool_{part}" for part in TOOL_COMPONENTS)
FEEDBACK_RATING = "judge_rating"
FEEDBACK_JUDGE = "judge_status"
FEEDBACK_TOTAL = "reward_total"
FEEDBACK_ADVANTAGES = ("advantage_tool", "advantage_summary")
FEEDBACK = (
    FEEDBACK_TOOL,
    *FEEDBACK_PARTS,
    FEEDBACK_RATING,
    FEEDBACK_JUDGE,
    FEEDBACK_TOTAL,
    *FEEDBACK_ADVANTAGES,
)
"""Feedback names on every trace (as :data:`CONDITIONAL` numbers, only where known).

- ``reward_tool`` and ``tool_<part>`` (the HierR parts): source CODE, the reward preset
  (``slca.reward``);
- ``judge_rating``: source LLM_JUDGE, the judge and its prompt version (``slca.judge``), the
  judge's reason as rationale; a failed judgment is a feedback with an error (``JUDGE_FAILED``),
  a short-circuit gives none;
- ``judge_status``: ``ok`` | ``short_circuit`` | ``failed``, the same source, the reason as
  rationale (``feedback.judge_status = 'failed'`` finds the failures);
- ``reward_total``: the routed total, source CODE (the reward preset);
- ``advantage_tool``, ``advantage_summary``: source CODE, the estimator (``slca.estimator``).
"""
JUDGE_FAILED = "JUDGE_FAILED"
"""The error code of a failed judgment's ``judge_rating`` feedback."""

ROOT_SPAN = "AGENT"
TURN_SPAN = "CHAT_MODEL"
TOOL_SPAN = "TOOL"


@dataclass(frozen=True)
class TraceSources:
    """Who produced what a trace records: the recipe's names (redacted as the run's tags are).

    Attributes:
        simulator: on every TOOL span (``slca.simulator``).
        reward: the source id of the reward feedback (``slca.reward``, e.g. ``hierr/strict``).
        judge: the source id of the judge's feedback (``slca.judge``, e.g. ``rubric@rubric-v2``).
        estimator: the source id of the advantages (``slca.estimator``, e.g. ``slca_grpo``).

    """

    simulator: str = ""
    reward: str = ""
    judge: str = ""
    estimator: str = ""

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> TraceSources:
        """The sources a recipe's tags name."""
        return cls(*(tags.get(t, "") for t in (SIMULATOR, REWARD, JUDGE, ESTIMATOR)))


def feedback(record: RolloutRecord, sources: TraceSources) -> list[Any]:
    """The trace's assessments (:data:`FEEDBACK`), as MLflow ``Feedback``; unknowns left out."""
    from mlflow.entities import AssessmentError, AssessmentSource, Feedback

    code = AssessmentSource("CODE", sources.reward or "reward")
    judge = AssessmentSource("LLM_JUDGE", sources.judge or "judge")
    estimator = AssessmentSource("CODE", sources.estimator or "estimator")
    r = record.rewards
    numbers = [
        (FEEDBACK_TOOL, r.tool, code),
        *(
            (name, r.components.get(part), code)
            for name, part in zip(FEEDBACK_PARTS, TOOL_COMPONENTS, strict=True)
        ),
        (FEEDBACK_TOTAL, r.total, code),
        (FEEDBACK_ADVANTAGES[0], record.tool_adv, estimator),
        (FEEDBACK_ADVANTAGES[1], record.summary_adv, estimator),
    ]
    out = [
        Feedback(name=name, value=number, source=source)
        for name, value, source in numbers
        if (number := finite_or_none(value)) is not None
    ]
    reason = r.judge_reason or None
    if r.judge_status == "ok" and r.rating is not None:
        out.append(
            Feedback(name=FEEDBACK_RATING, value=int(r.rating), source=judge, rationale=reason)
        )
    elif r.judge_status == "failed":
        error = AssessmentError(JUDGE_FAILED, reason or "the judge gave no rating")
        out.append(Feedback(name=FEEDBACK_RATING, error=error, source=judge))
    if r.judge_status:
        out.append(
            Feedback(name=FEEDBACK_JUDGE, value=r.judge_status, source=judge, rationale=reason)
        )
    return out


def trace_tags(record: RolloutRecord) -> dict[str, str]:
    """The trace's tags (strings, as MLflow keeps them)."""
    run = record.run
    values = (
        record.step,
        record.split,
        record.group,
        record.sample,
        record.rank,
        run.get("algorithm", ""),
        run.get("seed", ""),
        run.get("engine", ""),
    )
    return {tag: str(value) for tag, value in zip(TAGS, values, strict=True)}


def root_attributes(record: RolloutRecord) -> dict[str, Any]:
    """The root span's numbers, flags and judge status (unknown numbers left out)."""
    r, drift = record.rewards, record.drift
    numbers = (
        r.tool,
        *(r.components.get(part) for part in ("format", "name", "key", "value", "parallel")),
        r.summary,
        r.rating,
        r.raw_rating,
        r.routed_tool,
        r.routed_summary,
        r.total,
        r.hierr,
        record.tool_adv,
        record.summary_adv,
        record.segment_tokens("tool"),
        record.segment_tokens("summary"),
        record.segment_tokens("env"),
        None if drift is None else drift.mismatched,
        None if drift is None else drift.first,
    )
    out: dict[str, Any] = {}
    for name, value in zip(ROOT_NUMBERS, numbers, strict=True):
        number = finite_or_none(value)
        if number is not None:
            out[name] = number
    out[ROOT_FLAGS[0]] = bool(record.ends_on_tool_call)
    out[ROOT_FLAGS[1]] = bool(r.should_no_call)
    out[ROOT_TEXT[0]] = r.judge_status
    if r.judge_reason:
        out[ROOT_TEXT[1]] = r.judge_reason
    if r.outcome is not None:
        out[ROOT_TEXT[2]] = r.outcome
    if drift is not None:
        out["slca.drift.tokens"] = int(drift.mismatched)
    if drift is not None and drift.first is not None:
        out.update(zip(DRIFT_TEXT, (drift.where, drift.expected, drift.found), strict=True))
        out["slca.drift.first"] = int(drift.first)
    return out


def write_trace(
    record: RolloutRecord, *, run_id: str, experiment_id: str, sources: TraceSources
) -> str:
    """Write ``record`` as one trace linked to ``run_id``; returns the trace id.

    Uses MLflow's tracking URI of this process (``mlflow.set_tracking_uri``); the caller sets
    it to the run's store. The assessments are attached while the trace is open, so they travel
    with it in the one background export (no request of their own).

    Args:
        record: the rollout.
        run_id: the MLflow run the trace is linked to.
        experiment_id: the run's experiment (where the trace is stored).
        sources: the simulator (on each TOOL span) and the assessments' sources.

    """
    # Trace and span ids come from Python's global random generator (OpenTelemetry's
    # RandomIdGenerator), which the engines seed with the run's seed: two runs of one seed would
    # draw the same ids, and the later run's traces would replace the earlier's in the store.
    # The ids get fresh entropy; the run's own random stream is put back untouched.
    state = random.getstate()
    random.seed()
    try:
        return _write(record, run_id, experiment_id, sources)
    finally:
        random.setstate(state)


def _write(record: RolloutRecord, run_id: str, experiment_id: str, sources: TraceSources) -> str:
    simulator = sources.simulator
    import mlflow
    from mlflow.entities.trace_location import MlflowExperimentLocation

    name = f"{record.split} step {record.step} {record.group}#{record.sample}"
    with mlflow.start_span(
        name,
        span_type=ROOT_SPAN,
        run_id=run_id,
        trace_destination=MlflowExperimentLocation(experiment_id),
    ) as root:
        root.set_inputs({"prompt": record.prompt, "tools": record.tools})
        root.set_attributes(root_attributes(record))
        assistant = -1
        for turn in record.turns:
            if turn.role != "assistant":
                continue
            assistant += 1
            with mlflow.start_span(f"assistant turn {assistant + 1}", span_type=TURN_SPAN) as span:
                span.set_inputs({"turn": assistant + 1})
                span.set_outputs({"text": turn.text})
                span.set_attributes(
                    dict(
                        zip(
                            TURN_ATTRIBUTES, (assistant + 1, turn.segment, turn.tokens), strict=True
                        )
                    )
                )
            for call in (c for c in record.calls if c.turn == assistant):
                with mlflow.start_span(call.name, span_type=TOOL_SPAN) as span:
                    span.set_inputs({"name": call.name, "arguments": call.arguments})
                    answer = call.answer
                    span.set_outputs(
                        {
                            "content": answer.content if answer else None,
                            "simulator": simulator,
                            "status": answer.status if answer else None,
                            "cached": answer.cached if answer else None,
                        }
                    )
                    span.set_attributes(_tool_attributes(call, assistant + 1, simulator))
        root.set_outputs({"summary": record.summary_text})
        mlflow.update_current_trace(tags=trace_tags(record))
        for assessment in feedback(record, sources):
            mlflow.log_assessment(trace_id=root.trace_id, assessment=assessment)
        return root.trace_id


def _tool_attributes(call: Any, turn: int, simulator: str) -> dict[str, Any]:  # noqa: ANN401
    """A TOOL span's attributes; ``slca.cached`` only where the engine knows it."""
    answer = call.answer
    status = (answer.status if answer else None) or ("unanswered" if answer is None else "")
    values = (turn, simulator, status or "unknown", None if answer is None else answer.cached)
    return {k: v for k, v in zip(TOOL_ATTRIBUTES, values, strict=True) if v is not None}
