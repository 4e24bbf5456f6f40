"""``slca-exp rejudge``: a run's (or a sweep's) stored rollouts rated by another judge.

    slca-exp rejudge RUN_OR_SWEEP judge=<option> [judge.KEY=VALUE ...] [--split all|train|val]
        [--tracking-uri URI]

Would another judge have said the same? No training is repeated:

    store     --tracking-uri, else the store slca-exp train logs to
      -> runs      a sweep id or parent run id: its child runs; else a run id or name
      -> records   every logged step's rollouts (rollouts/train, rollouts/val) the run's judge
                   was asked about, from the records the run logged
      -> judge     the judge the overrides compose, shown what the run's reward showed its own
                   (reward.judge_view, reward.judge_prompt and reward.no_tool_response, read
                   from the run's params); one batch per run, through the judge's cache, so a
                   repeat asks the judge nothing
      -> feedback  the new rating on each rollout's trace, feedback judge_rating from the new
                   judge's source (a failed judgment as a failed assessment); once per source
      -> stdout    how the judges agree (the run's judge's own ratings against the new ones):
                   Spearman's rho, exact agreement, quadratically weighted kappa on 1-5; on a
                   sweep of two algorithms, the paired difference of the final validation's mean
                   summary reward under each judge, and whether it keeps its sign and verdict

MLflow's ``mlflow.genai.evaluate(data=traces, scorers=...)`` re-scores traces too, but it runs
inside an MLflow run of its own (or the active one) and calls each scorer once per trace from a
thread pool: rejudging a sweep would add runs to the sweep's experiment (which ``compare`` then
reads) or reopen every training run, and the judge would lose its batching. The rating is
attached to the same traces with ``mlflow.log_feedback`` instead, which is what ``evaluate``
records for a trace.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from slca_exp.core import tags
from slca_exp.core.problems import EXIT_BAD_CONFIG

PREFIX = "slca-exp rejudge: "
FACTOR = "algorithm"


class RejudgeError(Exception):
    """A user-facing refusal: exit status 2."""


@dataclass
class Rejudged:
    """One run's rollouts under both judges."""

    run: Any
    old: list[int] = field(default_factory=list)
    new: list[int] = field(default_factory=list)
    requests: int = 0
    """Rollouts the judge rated anew (its cache and short-circuits left out)."""
    cached: int = 0
    logged: int = 0
    final_old: list[float] = field(default_factory=list)
    final_new: list[float] = field(default_factory=list)


def agreement(old: Sequence[int], new: Sequence[int]) -> dict[str, float]:
    """Spearman's rho, exact agreement and quadratically weighted kappa of two 1-5 ratings.

    >>> a = agreement([1, 2, 3, 4, 5], [1, 2, 3, 4, 5])
    >>> a["n"], a["exact"], a["kappa"]
    (5, 1.0, 1.0)

    """
    from scipy.stats import spearmanr

    n = len(old)
    if n == 0:
        return {"n": 0, "spearman": math.nan, "exact": math.nan, "kappa": math.nan}
    exact = sum(a == b for a, b in zip(old, new, strict=True)) / n
    rho = float(spearmanr(old, new)[0]) if len(set(old)) > 1 and len(set(new)) > 1 else math.nan
    levels = range(1, 6)
    observed = {(i, j): 0.0 for i in levels for j in levels}
    for a, b in zip(old, new, strict=True):
        observed[a, b] += 1 / n
    row = {i: sum(observed[i, j] for j in levels) for i in levels}
    col = {j: sum(observed[i, j] for i in levels) for j in levels}
    weight = {(i, j): (i - j) ** 2 / 16 for i in levels for j in levels}
    seen = math.fsum(weight[k] * observed[k] for k in observed)
    chance = math.fsum(weight[i, j] * row[i] * col[j] for i in levels for j in levels)
    kappa = 1 - seen / chance if chance > 0 else math.nan
    return {"n": n, "spearman": rho, "exact": exact, "kappa": kappa}


def main(argv: Sequence[str]) -> int:
    """Run ``slca-exp rejudge``; returns the exit status (0, or 2 when refused)."""
    from slca_exp.analysis.runs import CompareError
    from slca_exp.preflight.validate import ConfigError
    from slca_exp.tracking import readback

    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        return _rejudge(args)
    except (RejudgeError, CompareError, readback.ReadbackError) as err:
        print(f"{PREFIX}{err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except ConfigError as err:
        print(f"{PREFIX}the judge's overrides do not validate:\n{err}", file=sys.stderr)
        return EXIT_BAD_CONFIG


def _rejudge(args: argparse.Namespace) -> int:
    import mlflow
    from mlflow.tracking import MlflowClient

    from slca_exp.judges import build_judge, describe_judge
    from slca_exp.preflight.compose import compose_run
    from slca_exp.preflight.validate import validate
    from slca_exp.recipe import service_tag
    from slca_exp.tracking import readback
    from slca_exp.tracking.uris import absolute_uri, default_tracking_uri

    wrong = [o for o in args.overrides if not o.startswith(("judge=", "judge."))]
    if wrong or not args.overrides:
        raise RejudgeError(
            (f"{wrong[0]!r} is not a judge override. " if wrong else "no judge given. ")
            + "Name the other judge and its settings only, e.g. judge=openai "
            "judge.base_url=http://gpu-node:8000/v1 (or judge=rubric judge.rubric_version=v1)"
        )
    judge_cfg = validate(compose_run(list(args.overrides))).judge
    source = service_tag(describe_judge(judge_cfg))
    uri = absolute_uri(args.tracking_uri) if args.tracking_uri else default_tracking_uri()
    readback.check_store(uri, explicit=bool(args.tracking_uri))
    client = MlflowClient(tracking_uri=uri)
    mlflow.set_tracking_uri(uri)  # the traces' fluent API (search_traces, log_feedback)
    label, runs, swept = _runs(client, args.target)
    splits = ("train", "val") if args.split == "all" else (args.split,)
    print(f"{label}: {len(runs)} run{'s' if len(runs) != 1 else ''}, rejudged by {source}")
    done = []
    with build_judge(judge_cfg) as judge:
        for run in runs:
            done.append(_rejudge_run(client, uri, run, judge, source, splits))
            _print_run(done[-1], swept)
    old = [r for d in done for r in d.old]
    new = [r for d in done for r in d.new]
    print(f"all: {_agreement_text(agreement(old, new))}")
    fresh, cached = sum(d.requests for d in done), sum(d.cached for d in done)
    logged = sum(d.logged for d in done)
    print(
        f"judge: {fresh} rollouts rated anew, {cached} from its cache; feedback logged on "
        f"{logged} traces (source {source})"
    )
    if FACTOR in swept:
        print(_sign_check(done, swept))
    return 0


def _runs(client: Any, target: str) -> tuple[str, list[Any], list[str]]:  # noqa: ANN401
    from slca_exp.analysis.runs import CompareError, find_runs
    from slca_exp.tracking import readback

    if readback.looks_like_run_id(target):
        run = readback.get_run(client, target)
        if run is not None and run.data.tags.get(tags.ROLE) != tags.PARENT_ROLE:
            return f"run {target}", [run], []
    try:
        selection = find_runs(client, target)
    except CompareError:  # not a sweep, a parent run or an experiment: a run id or name
        run = readback.find_run(client, target)
        return f"run {run.info.run_name or run.info.run_id}", [run], []
    return selection.label, selection.runs, list(selection.swept)


def _rejudge_run(
    client: Any,  # noqa: ANN401 - an MlflowClient
    uri: str,
    run: Any,  # noqa: ANN401 - an mlflow Run
    judge: Any,  # noqa: ANN401 - a Judge
    source: str,
    splits: Sequence[str],
) -> Rejudged:
    from slca_exp.rewards.judging import JudgeRequest
    from slca_exp.rewards.scorer import needs_tool_response
    from slca_exp.rollouts.pairing import question
    from slca_exp.tracking import readback

    params = run.data.params
    view = params.get("reward.judge_view") or "responses"
    prompt = params.get("reward.judge_prompt")
    prompt = None if prompt in (None, "", "None", "null") else prompt  # params hold text
    variant = params.get("reward.variant", "strict")
    no_tool_response = params.get("reward.no_tool_response", "zero")
    records, final = [], set()
    for split in splits:
        steps = readback.logged_steps(client, run.info.run_id, split)
        for step in steps:
            for record in readback.download_records(uri, run.info.run_id, split, step):
                if record.rewards.judge_status:  # the run's judge was asked about it
                    records.append(record)
                    if split == "val" and step == steps[-1]:
                        final.add(id(record))
    requests = [
        JudgeRequest(
            question(r),
            r.response,
            needs_tool_response(variant, no_tool_response, bool(r.gold)),
            view,
            prompt,
        )
        for r in records
    ]
    before = judge.stats()
    results = judge.score(requests) if requests else []
    after = judge.stats()
    done = Rejudged(run)
    done.cached = int(after.get("cache_hits", 0) - before.get("cache_hits", 0))
    done.requests = int(
        after.get("requests", 0)
        - before.get("requests", 0)
        - (after.get("cache_hits", 0) - before.get("cache_hits", 0))
        - (after.get("short_circuits", 0) - before.get("short_circuits", 0))
    )
    for record, result in zip(records, results, strict=True):
        own = record.rewards.raw_rating or record.rewards.rating
        if result.status == "ok" and own is not None and record.rewards.judge_status == "ok":
            done.old.append(int(own))
            done.new.append(int(result.rating))
        summary = record.rewards.summary
        known = summary is not None and math.isfinite(summary) and math.isfinite(result.score)
        if id(record) in final and known:
            done.final_old.append(summary)
            done.final_new.append(result.score)
    done.logged = _log_feedback(run, records, results, source)
    return done


def _log_feedback(run: Any, records: list, results: list, source: str) -> int:  # noqa: ANN401
    """The new ratings as feedback on the rollouts' traces; returns how many were logged."""
    import mlflow
    from mlflow.entities import AssessmentError, AssessmentSource

    from slca_exp.tracking.rollout_traces import (
        FEEDBACK_RATING,
        JUDGE_FAILED,
        TAG_GROUP,
        TAG_SAMPLE,
        TAG_SPLIT,
        TAG_STEP,
    )

    traces = mlflow.search_traces(
        run_id=run.info.run_id, locations=[run.info.experiment_id], return_type="list"
    )
    keys = (TAG_SPLIT, TAG_STEP, TAG_GROUP, TAG_SAMPLE)
    by_key = {tuple(t.info.tags.get(k) for k in keys): t for t in traces}
    judge = AssessmentSource("LLM_JUDGE", source)
    logged = 0
    for record, result in zip(records, results, strict=True):
        trace = by_key.get((record.split, str(record.step), record.group, str(record.sample)))
        if trace is None or result.status == "short_circuit":
            continue
        if any(
            a.name == FEEDBACK_RATING and a.source.source_id == source
            for a in trace.info.assessments
        ):
            continue  # rejudged by this judge before
        if result.status == "ok":
            mlflow.log_feedback(
                trace_id=trace.info.trace_id,
                name=FEEDBACK_RATING,
                value=int(result.rating),
                source=judge,
                rationale=result.reason or None,
            )
        else:
            error = AssessmentError(JUDGE_FAILED, result.reason or "the judge gave no rating")
            mlflow.log_feedback(
                trace_id=trace.info.trace_id, name=FEEDBACK_RATING, error=error, source=judge
            )
        logged += 1
    return logged


def _agreement_text(a: dict[str, float]) -> str:
    def num(x: float) -> str:
        return "-" if math.isnan(x) else f"{round(x, 3) + 0.0:.3f}"  # no "-0.000"

    return (
        f"{a['n']} ratings both judges gave: Spearman rho {num(a['spearman'])}, exact "
        f"agreement {num(a['exact'])}, weighted kappa {num(a['kappa'])}"
    )


def _print_run(done: Rejudged, swept: Sequence[str]) -> None:
    from slca_exp.analysis.runs import swept_value

    values = ", ".join(f"{k}={swept_value(done.run, k)}" for k in swept)
    name = f"run {done.run.info.run_id}" + (f" ({values})" if values else "")
    print(f"  {name}: {_agreement_text(agreement(done.old, done.new))}")


def _sign_check(done: Sequence[Rejudged], swept: Sequence[str]) -> str:
    """Per cell of the other swept keys: the algorithms' paired difference under both judges."""
    from slca_exp.analysis.differences import levels
    from slca_exp.analysis.estimates import paired
    from slca_exp.analysis.runs import seed_of, swept_value

    runs = [d.run for d in done]
    algorithms = levels(runs, FACTOR, swept_value)
    if len(algorithms) != 2:
        return f"sign check: {FACTOR} has {len(algorithms)} levels here, not 2"
    a_name, b_name = algorithms
    others = [k for k in swept if k not in (FACTOR, "seed")]
    cells: dict[tuple[str, ...], dict[str, Any]] = {}
    for d in done:
        key = tuple(swept_value(d.run, k) for k in others)
        cells.setdefault(key, {}).setdefault(seed_of(d.run), {})[swept_value(d.run, FACTOR)] = d
    lines = [
        f"sign check: {b_name} - {a_name}, the final validation's mean summary reward over its "
        "logged rollouts (paired over seeds), under the run's judge and the new one:"
    ]
    for key, seeds in sorted(cells.items()):
        pairs = [s for s in seeds.values() if set(s) == {a_name, b_name}]
        label = ", ".join(f"{k}={v}" for k, v in zip(others, key, strict=True)) or "all runs"
        means = {
            which: (
                [_mean(getattr(s[a_name], which)) for s in pairs],
                [_mean(getattr(s[b_name], which)) for s in pairs],
            )
            for which in ("final_old", "final_new")
        }
        if not pairs or any(math.isnan(x) for v in means.values() for side in v for x in side):
            lines.append(f"  {label}: no seed has both algorithms' final validation rollouts")
            continue
        old, new = paired(*means["final_old"]), paired(*means["final_new"])
        sign = "kept" if _sign(old.mean) == _sign(new.mean) else "changed"
        verdict = "kept" if old.verdict == new.verdict else "changed"
        lines.append(
            f"  {label}: run's judge {old.mean:+.3f} ({old.verdict}), new judge "
            f"{new.mean:+.3f} ({new.verdict}); sign {sign}, verdict {verdict} (n={len(pairs)})"
        )
    return "\n".join(lines)


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slca-exp rejudge",
        description="Rate a run's (or a sweep's) logged rollouts with another judge, without "
        "training again: logs each new rating as feedback on the rollout's trace and prints how "
        "the two judges agree (Spearman rho, exact agreement, weighted kappa) and, on a sweep of "
        "two algorithms, whether their difference keeps its sign and verdict.",
    )
    parser.add_argument("target", metavar="RUN_OR_SWEEP", help="a run id or name, a sweep id")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="judge=OPTION",
        help="the other judge: judge=<option> and judge.KEY=VALUE overrides",
    )
    parser.add_argument(
        "--split",
        choices=("all", "train", "val"),
        default="all",
        help="which logged rollouts (default: all)",
    )
    parser.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="MLflow tracking URI; default: the store slca-exp train logs to",
    )
    return parser
