"""Every metric name slca-exp logs, defined once, each with its one-line meaning.

Code never spells a metric name as a literal: it uses the constants and helpers below, and a
test fails on a metric name spelled anywhere else in ``slca_exp``. The metric glossary in
docs/metrics.md is this module's own table (``python -m slca_exp.core.names``), checked by the
test suite, so a name added here without a glossary line (or the other way round) fails CI.

Segments are ``tool`` (every learnable run of a rollout but the last) and ``summary`` (the last
learnable run); see ``slca_exp.estimators.segments``.
"""

from __future__ import annotations

from typing import Final, Literal

Segment = Literal["tool", "summary"]
SEGMENTS: Final[tuple[Segment, ...]] = ("tool", "summary")
ADV_STATS: Final[tuple[str, ...]] = ("mean", "std", "abs_mean", "min", "max")
TOOL_COMPONENTS: Final[tuple[str, ...]] = ("format", "name", "key", "value", "parallel")
PHASES: Final[tuple[str, ...]] = ("generate", "simulate", "reward", "advantage", "update")

REWARD_TOOL_MEAN: Final = "reward/tool/mean"
REWARD_TOOL_STD: Final = "reward/tool/std"
REWARD_SUMMARY_MEAN: Final = "reward/summary/mean"
REWARD_SUMMARY_STD: Final = "reward/summary/std"
REWARD_TOTAL_MEAN: Final = "reward/total/mean"
REWARD_NO_CALL_FRAC: Final = "reward/no_call/frac"
REWARD_TOOL_HIERR_MEAN: Final = "reward/tool/hierr/mean"
REWARD_OUTCOME_SOLVED_FRAC: Final = "reward/outcome/solved_frac"
OUTCOME_REQUESTS: Final = "outcome/requests"
OUTCOME_FAILURES: Final = "outcome/failures"
OUTCOME_FALLBACK_FRAC: Final = "outcome/fallback_frac"
OUTCOME_CACHE_HIT_FRAC: Final = "outcome/cache_hit_frac"
JUDGE_REQUESTS: Final = "judge/requests"
JUDGE_FAILURES: Final = "judge/failures"
JUDGE_CACHE_HIT_FRAC: Final = "judge/cache_hit_frac"
JUDGE_LATENCY_MS: Final = "judge/latency_ms"
JUDGE_RATING: Final = "judge/rating"
JUDGE_RAW_RATING: Final = "judge/raw_rating"
JUDGE_PERTURBED_FRAC: Final = "judge/perturbed_frac"
SIMULATOR_REQUESTS: Final = "simulator/requests"
SIMULATOR_FAILURES: Final = "simulator/failures"
SIMULATOR_CACHE_HIT_FRAC: Final = "simulator/cache_hit_frac"
TRAIN_LOSS: Final = "train/loss"
TRAIN_KL: Final = "train/kl"
TRAIN_ENTROPY: Final = "train/entropy"
TRAIN_GRAD_NORM: Final = "train/grad_norm"
TRAIN_LR: Final = "train/lr"
PERF_STEP_S: Final = "perf/step_s"
PERF_TOKENS_PER_S: Final = "perf/tokens_per_s"
PERF_ROLLOUT_LOG_S: Final = "perf/time/rollout_log"
ROLLOUT_TOKEN_MISMATCH_FRAC: Final = "rollout/token_mismatch_frac"
TRAIN_GRAD_COS: Final = "train/grad_cos"
TRAIN_GRAD_NORM_TOOL: Final = "train/grad_norm_tool"
TRAIN_GRAD_NORM_SUMMARY: Final = "train/grad_norm_summary"
TRAIN_SKIPPED_STEPS: Final = "train/skipped_steps"
SEGMENT_CUTOFF_FRAC: Final = "segment/cutoff_frac"
SFT_LOSS: Final = "sft/loss"
SFT_SKIPPED_BATCHES: Final = "sft/skipped_batches"
VAL_PREFIX: Final = "val/"
"""``val/<name>``: metric ``<name>`` on the validation split (:func:`val`)."""
SUCCESS_THRESHOLDS: Final[tuple[float, ...]] = (0.7, 0.8, 0.9, 1.0)
"""The paper's success@k thresholds."""
VAL_SUCCESS: Final = "val/success@0.9"


def val(name: str) -> str:
    """``val/{name}``: the same metric on the validation split."""
    return VAL_PREFIX + name


def val_success(threshold: float) -> str:
    """``val/success@{k}``: validation rows whose normalised total score is at least k."""
    _check(threshold, SUCCESS_THRESHOLDS, "success threshold")
    return f"val/success@{threshold:g}" if threshold < 1 else "val/success@1.0"


def val_tool_success(threshold: float) -> str:
    """``val/tool_success@{k}``: validation rows whose HierR tool process score is at least k."""
    _check(threshold, SUCCESS_THRESHOLDS, "success threshold")
    return f"val/tool_success@{threshold:g}" if threshold < 1 else "val/tool_success@1.0"


def tool_component(part: str) -> str:
    """``reward/tool/{part}/mean``: the batch mean of one component of the tool process score."""
    _check(part, TOOL_COMPONENTS, "tool reward component")
    return f"reward/tool/{part}/mean"


def adv(segment: Segment, stat: str) -> str:
    """``adv/{segment}/{stat}``: a statistic of the per-rollout advantage routed to a segment."""
    _check(segment, SEGMENTS, "segment")
    _check(stat, ADV_STATS, "advantage statistic")
    return f"adv/{segment}/{stat}"


def present_frac(segment: Segment) -> str:
    """``segment/{segment}/present_frac``."""
    _check(segment, SEGMENTS, "segment")
    return f"segment/{segment}/present_frac"


def zeroed_group_frac(segment: Segment) -> str:
    """``segment/{segment}/zeroed_group_frac``."""
    _check(segment, SEGMENTS, "segment")
    return f"segment/{segment}/zeroed_group_frac"


def tokens_mean(segment: Segment) -> str:
    """``segment/{segment}/tokens/mean``."""
    _check(segment, SEGMENTS, "segment")
    return f"segment/{segment}/tokens/mean"


EVAL_PREFIX: Final = "eval/"
"""``eval/<benchmark>/<category>``: a checkpoint's benchmark scores (:func:`eval_metric`)."""
EVAL_OVERALL: Final = "overall"
"""The category name of a benchmark's overall score."""


def eval_metric(benchmark: str, category: str) -> str:
    """``eval/{benchmark}/{category}``: a benchmark's score of the run's checkpoint.

    >>> eval_metric("bfcl", "simple_python")
    'eval/bfcl/simple_python'
    """
    return f"{EVAL_PREFIX}{benchmark}/{category}"


def is_eval_metric(name: str) -> bool:
    """Whether ``name`` is an :func:`eval_metric` (``eval/<benchmark>/<category>``).

    >>> is_eval_metric("eval/bfcl/overall"), is_eval_metric("eval/bfcl")
    (True, False)
    """
    parts = name.split("/")
    return name.startswith(EVAL_PREFIX) and len(parts) == 3 and all(parts)


def perf_time(phase: str) -> str:
    """``perf/time/{phase}``: seconds a step spent in one phase."""
    _check(phase, PHASES, "phase")
    return f"perf/time/{phase}"


def _check(value: object, allowed: tuple[object, ...], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {', '.join(allowed)}")


def _catalogue() -> dict[str, str]:
    m: dict[str, str] = {
        REWARD_TOOL_MEAN: "mean HierR tool process score over the batch",
        REWARD_TOOL_STD: "std of the tool process score over the batch",
        REWARD_SUMMARY_MEAN: "mean judge summary score, (rating - 1) / 4, over scored rollouts",
        REWARD_SUMMARY_STD: "std of the summary score over scored rollouts",
        REWARD_TOTAL_MEAN: (
            "mean total score (w_process * tool + w_summary * summary, or the penalty)"
        ),
        REWARD_NO_CALL_FRAC: "fraction of rollouts that needed a tool call and made none",
        REWARD_TOOL_HIERR_MEAN: (
            "mean HierR tool process score (gold matching); the same as reward/tool/mean "
            "unless reward.tool_reward=outcome, where it is logged only, for comparison"
        ),
        REWARD_OUTCOME_SOLVED_FRAC: (
            "fraction of the rollouts the outcome judge decided that it judged Solved "
            "(reward.tool_reward=outcome; a short answer counts as Unsolved)"
        ),
        OUTCOME_REQUESTS: "rollouts the outcome judge was asked about (not decided by a rule)",
        OUTCOME_FAILURES: "outcome judge calls that failed after retries (their R_tool is absent)",
        OUTCOME_FALLBACK_FRAC: (
            "fraction of outcome judge requests answered Unsure first, so asked the fallback prompt"
        ),
        OUTCOME_CACHE_HIT_FRAC: "fraction of outcome judge requests answered from the cache",
    }
    for part in TOOL_COMPONENTS:
        m[tool_component(part)] = f"mean of the '{part}' component of the tool process score"
    stat_doc = {
        "mean": "mean",
        "std": "unbiased std",
        "abs_mean": "mean absolute value",
        "min": "minimum",
        "max": "maximum",
    }
    for seg in SEGMENTS:
        for stat in ADV_STATS:
            m[adv(seg, stat)] = (
                f"{stat_doc[stat]} of the per-rollout advantage on {seg} tokens, over rollouts "
                f"whose {seg} segment is present"
            )
        m[present_frac(seg)] = (
            f"fraction of rollouts whose {seg} segment is present (has tokens and a finite score)"
        )
        m[zeroed_group_frac(seg)] = (
            f"fraction of groups in which no rollout gets a non-zero {seg} advantage "
            "(fewer than 2 present members, or identical scores)"
        )
        m[tokens_mean(seg)] = f"mean number of {seg} tokens over rollouts that have a {seg} segment"
    m[SEGMENT_CUTOFF_FRAC] = (
        "fraction of rollouts whose last assistant turn is a tool call no response followed (out "
        "of turns or tokens, or malformed): under the parity mask rule that call is their "
        "'summary', under corrected they have none (local engine)"
    )
    m.update(
        {
            JUDGE_REQUESTS: "judge calls made in the step (rollouts not short-circuited)",
            JUDGE_FAILURES: "judge calls that failed after retries (their summary is absent)",
            JUDGE_CACHE_HIT_FRAC: "fraction of judge requests answered from the cache",
            JUDGE_LATENCY_MS: "mean judge request latency in milliseconds",
            JUDGE_RATING: "mean 1-5 rating the summary rewards used (after judge.noise)",
            JUDGE_RAW_RATING: "mean 1-5 rating the judge gave (before judge.noise)",
            JUDGE_PERTURBED_FRAC: "fraction of ratings judge.noise changed",
            SIMULATOR_REQUESTS: "tool calls the simulator was asked to answer (schema passed)",
            SIMULATOR_FAILURES: "simulator calls that failed after retries",
            SIMULATOR_CACHE_HIT_FRAC: "fraction of simulator requests answered from the cache",
            TRAIN_LOSS: "policy-gradient loss",
            TRAIN_KL: "mean KL to the reference policy",
            TRAIN_ENTROPY: "mean token entropy of the policy",
            TRAIN_GRAD_NORM: "gradient norm before clipping, mean over the optimizer steps taken",
            TRAIN_LR: "learning rate",
            TRAIN_SKIPPED_STEPS: (
                "optimizer steps of an RL step not taken because the gradient norm was NaN or "
                "infinite"
            ),
            TRAIN_GRAD_COS: (
                "cosine between the policy gradients of the tool-token and summary-token losses, "
                "on the step's batch before its update; 0 when either gradient is zero, NaN when "
                "a segment has no token in the batch (diagnostic, engine.rl.grad_cos, both engines)"
            ),
            TRAIN_GRAD_NORM_TOOL: (
                "norm of the policy gradient of the tool-token loss (token-mean over the batch's "
                "tool tokens), measured with train/grad_cos; 0 without tool tokens"
            ),
            TRAIN_GRAD_NORM_SUMMARY: (
                "norm of the policy gradient of the summary-token loss, measured with "
                "train/grad_cos; 0 without summary tokens"
            ),
            SFT_LOSS: "SFT cross-entropy on assistant tokens, last step",
            SFT_SKIPPED_BATCHES: (
                "SFT batches skipped for having no assistant token within engine.sft.max_len "
                "(never stepped on; another batch is drawn)"
            ),
            PERF_STEP_S: "wall-clock seconds per training step",
            PERF_TOKENS_PER_S: "response tokens processed per second",
            PERF_ROLLOUT_LOG_S: (
                "seconds spent logging a logged step's rollouts (traces, table, credit view; "
                "tracking.rollouts), at the steps that log them; not in perf/step_s"
            ),
            ROLLOUT_TOKEN_MISMATCH_FRAC: (
                "token drift of a logged step's rollouts: the tokens in which the ids the update "
                "used differ from the chat template's rendering of the same conversation, over "
                "all their tokens (0: none; the trace holds the first differing position), at "
                "the steps that log rollouts"
            ),
        }
    )
    for k in SUCCESS_THRESHOLDS:
        m[val_success(k)] = (
            f"fraction of validation rows whose normalised total score, (w_process * R_tool + "
            f"w_summary * R_sum) / (w_process + w_summary), is >= {k:g} (the paper's success@k)"
        )
    for k in SUCCESS_THRESHOLDS:
        m[val_tool_success(k)] = (
            f"fraction of validation rows whose HierR tool process score (gold matching, logged "
            f"under every reward.tool_reward) is >= {k:g}"
        )
    phase_doc = {
        "generate": "generation of assistant turns",
        "simulate": "the simulator answering tool calls",
        "reward": "reward scoring (tool process reward and judge)",
        "advantage": "the estimator",
        "update": "the policy update (forward, backward, optimizer)",
    }
    for phase in PHASES:
        m[perf_time(phase)] = f"seconds per step in {phase_doc[phase]}"
    m[eval_metric("<benchmark>", "<category>")] = (
        "slca-exp eval: the fraction of the category's scored items the benchmark's own checker "
        "passes, at the checkpoint's training step, in the run that trained the checkpoint"
    )
    m[eval_metric("<benchmark>", EVAL_OVERALL)] = (
        "slca-exp eval: the unweighted mean of the scored categories' accuracies"
    )
    return m


METRICS: Final[dict[str, str]] = _catalogue()
"""Every metric name -> its meaning. ``val/<name>`` is the same metric on the validation split."""

ESTIMATOR_STATS: Final[tuple[str, ...]] = tuple(
    name
    for name in METRICS
    if name.startswith(("adv/", "segment/")) and name != SEGMENT_CUTOFF_FRAC
)
"""The names an estimator's ``stats`` dict carries, in a stable order.

:data:`SEGMENT_CUTOFF_FRAC` is not among them: the engine reads it off the rollouts' text.
"""


def known(name: str) -> bool:
    """Whether slca-exp logs a metric of this name (``val/<name>`` included).

    >>> known("reward/tool/mean"), known("val/reward/tool/mean"), known("reward/tool")
    (True, True, False)
    """
    if is_eval_metric(name):
        return True
    return name in METRICS or (name.startswith(VAL_PREFIX) and name[len(VAL_PREFIX) :] in METRICS)


def glossary_markdown() -> str:
    """The metric glossary table of docs/metrics.md, generated from :data:`METRICS`."""
    rows = ["| metric | meaning |", "| --- | --- |"]
    rows += [f"| `{name}` | {doc} |" for name, doc in METRICS.items()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(glossary_markdown())
