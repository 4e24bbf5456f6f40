"""What logging rollouts costs, and what slca-exp's layer over verl costs, side by side.

1. Rollout logging on the local engine, the smoke recipe (``experiment=smoke``: its SFT, then
   RL): one run logs every third step's rollouts (``tracking.rollouts.every=3``), one logs none
   (``every=0``). Each logged step records how long its logging call took
   (``perf/time/rollout_log``). MLflow exports the step's traces (with their assessments) in a
   background thread while the next step runs; the logged run has steps right after a logged
   step and steps after an unlogged one, and the difference of their means (``perf/step_s``,
   which leaves the logging call out), within the one run, is what the export takes from
   training, given with the upper end of its 95% interval. The cost at the defaults
   (``every=10``: step 1 and every 10th) is the call and the export over ten steps of the run
   that logs nothing. The bytes each logged step adds to the store (artifacts and traces) give
   the MB per 1000 steps.
2. With ``--verl``: stock verl against slca-exp's layer over it, on ``experiment=verl_smoke``'s
   recipe (cpu backend, verl's vLLM rollout on vLLM's CPU build for both), one run after the
   other in this command, each RL step's time by phase (verl's own ``timing_s/*``):

   - stock: ``algorithm.name=grpo`` with verl's own trainer (``trainer.v1.trainer_mode=sync``),
     verl's ``naive`` reward manager and a plain reward function
     (``benchmarks/stock_reward.py``), verl's own tool agent loop; no slca-exp code in the step
     but the simulated tool both arms call (the environment);
   - slca-exp: ``slca_grpo`` with its trainer, reward side (HierR and the recipe's judge),
     segment split, per-segment metrics and rollout logging at every step
     (``tracking.rollouts.every=1``), MLflow's background trace export included.

   The goal is at most 5 % more per step; the table gives the ratio phase by phase.

    python benchmarks/rollout_cost.py [--rl-steps 30] [--sft-steps 400] [--verl | --verl-only]
        [--verl-steps 6] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from slca_exp.core import names  # noqa: E402

DEFAULT_EVERY = 10
"""``tracking.rollouts.every``'s default: what the cost is reported for."""
MEASURED_EVERY = 3
"""The logged run's ``tracking.rollouts.every``: it has steps after an unlogged step too."""
GOAL_LOGGING = 0.03
GOAL_LAYER = 0.05


def slca_train(args: list[str], cwd: Path, log: Path) -> None:
    """``slca-exp train ARGS`` in a subprocess; its output in ``log``."""
    exe = str(Path(sys.executable).parent / "slca-exp")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    with log.open("w") as out:
        res = subprocess.run([exe, "train", *args], cwd=cwd, env=env, stdout=out, stderr=out)
    if res.returncode != 0:
        raise SystemExit(f"slca-exp train failed ({res.returncode}):\n{log.read_text()[-4000:]}")


def only_run(uri: str, experiment: str):  # noqa: ANN201 - an mlflow Run
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    runs = [r for r in client.search_runs([found.experiment_id]) if "slca.stage" not in r.data.tags]
    if len(runs) != 1:
        raise SystemExit(f"expected one run in {experiment!r}, found {len(runs)}")
    return client, runs[0]


def history(client, run_id: str, name: str) -> dict[int, float]:  # noqa: ANN001
    return {m.step: m.value for m in client.get_metric_history(run_id, name)}


def stored_bytes(client, run, root: Path) -> tuple[int, int, int]:  # noqa: ANN001
    """(rollout artifact bytes, trace bytes, logged train steps) of a run."""
    import mlflow

    artifacts = Path(run.info.artifact_uri.removeprefix("file://")) / "rollouts"
    files = sum(p.stat().st_size for p in artifacts.rglob("*") if p.is_file())
    mlflow.set_tracking_uri(client.tracking_uri)
    traces = mlflow.search_traces(
        run_id=run.info.run_id, locations=[run.info.experiment_id], return_type="list"
    )
    trace_bytes = sum(int(t.info.trace_metadata.get("mlflow.trace.sizeBytes", 0)) for t in traces)
    steps = len(list((artifacts / "train").glob("*.jsonl")))
    return files, trace_bytes, steps


def export_upper_bound(exporting: list[float], quiet: list[float]) -> float:
    """The upper end of the 95% Welch interval of mean(exporting) - mean(quiet), in seconds."""
    from scipy import stats

    if len(exporting) < 2 or len(quiet) < 2:
        raise SystemExit("too few steps after a logged and after an unlogged step (2 each)")
    test = stats.ttest_ind(exporting, quiet, equal_var=False)
    return float(test.confidence_interval(0.95).high)


def local_cost(args: argparse.Namespace, root: Path) -> dict[str, float]:
    """Part 1: the smoke recipe with every third step logged, and with nothing logged."""
    from slca_exp.rollouts.select import due

    common = [
        "experiment=smoke",
        f"engine.sft.steps={args.sft_steps}",
        f"engine.rl.steps={args.rl_steps}",
        f"data.rows={args.rows}",
        "engine.progress=false",
        "tracking.plots=false",
        f"tracking.rollouts.per_step={args.per_step}",
        f"tracking.root={root}",
    ]
    uri = f"sqlite:///{root / 'mlflow.db'}"
    runs = {}
    for label, every in (("off", 0), ("logged", MEASURED_EVERY)):
        name = f"rollout-cost-{every}"
        log = root / f"local-{every}.log"
        slca_train(
            [*common, f"tracking.rollouts.every={every}", f"experiment_name={name}"], root, log
        )
        runs[label] = only_run(uri, name)
    client, logged = runs["logged"]
    _, quiet = runs["off"]
    step_s = history(client, logged.info.run_id, names.PERF_STEP_S)
    log_s = history(client, logged.info.run_id, names.PERF_ROLLOUT_LOG_S)
    quiet_s = history(client, quiet.info.run_id, names.PERF_STEP_S)
    val_s = history(client, logged.info.run_id, names.val(names.PERF_ROLLOUT_LOG_S))
    quiet = statistics.median(quiet_s[s] for s in quiet_s if s > 1)  # step 1 warms up

    def unlogged(after_logged: bool) -> list[float]:
        return [
            t
            for s, t in step_s.items()
            if s > 1
            and not due(s, MEASURED_EVERY)
            and due(s - 1, MEASURED_EVERY) == after_logged
            and s - 1 not in val_s  # a validation's rollouts export during the next step too
        ]

    after_logged, after_quiet = unlogged(True), unlogged(False)
    if not after_logged or not after_quiet:
        raise SystemExit(f"--rl-steps {args.rl_steps}: too few steps to measure the export")
    exporting = statistics.fmean(after_logged)
    not_exporting = statistics.fmean(after_quiet)
    difference = exporting - not_exporting  # the steps' noise can make it negative
    upper = export_upper_bound(after_logged, after_quiet)
    logging = statistics.median(log_s[s] for s in log_s if s > 1)
    files, traces, steps = stored_bytes(client, logged, root)
    per_step = (files + traces) / max(steps + len(val_s), 1)
    logged_per_1000 = 1000 // DEFAULT_EVERY + 1
    cost = logging * logged_per_1000 / (1000 * quiet)
    background = max(0.0, difference)
    cost_all = (logging + background) * logged_per_1000 / (1000 * quiet)
    cost_upper = (logging + max(0.0, upper)) * logged_per_1000 / (1000 * quiet)
    print("\n1. rollout logging, local engine, smoke recipe")
    print(f"   RL step with every=0 (median of steps 2-{args.rl_steps}, perf/step_s): "
          f"{quiet * 1e3:8.1f} ms")  # fmt: skip
    print(f"   logged run (every={MEASURED_EVERY}), mean step after a logged step: "
          f"{exporting * 1e3:.1f} ms ({len(after_logged)} steps), after an unlogged step: "
          f"{not_exporting * 1e3:.1f} ms ({len(after_quiet)} steps): the background export "
          f"adds {difference * 1e3:+.1f} ms to a logged step's next step, at most "
          f"{upper * 1e3:+.1f} ms (upper end of the 95% interval, Welch)")  # fmt: skip
    val_ms = statistics.median(val_s.values()) * 1e3 if val_s else float("nan")
    print(f"   logging one step's {args.per_step} rollouts:  {logging * 1e3:8.1f} ms (median "
          f"perf/time/rollout_log); a validation's: {val_ms:.1f} ms")  # fmt: skip
    print(f"   at the defaults (every={DEFAULT_EVERY}: {logged_per_1000} logged steps per 1000): "
          f"{cost * 100:.2f} % of the every=0 step "
          f"(goal <= {GOAL_LOGGING * 100:.0f} %)")  # fmt: skip
    print(f"   with the background export: {background * 1e3:.1f} ms more per logged step, "
          f"{cost_all * 100:.2f} % of the every=0 step, at most {cost_upper * 100:.2f} % "
          f"(goal <= {GOAL_LOGGING * 100:.0f} %)")  # fmt: skip
    print(f"   stored per logged step: {files / max(steps + len(val_s), 1) / 1e3:.1f} kB of "
          f"artifacts + {traces / max(steps + len(val_s), 1) / 1e3:.1f} kB of traces; "
          f"{per_step * logged_per_1000 / 1e6:.1f} MB per 1000 steps at the defaults "
          "(validations add one logged step each)")  # fmt: skip
    return {
        "cost": cost,
        "cost_with_export": cost_all,
        "cost_with_export_upper": cost_upper,
        "mb_per_1000": per_step * logged_per_1000 / 1e6,
    }


STOCK = [
    "trainer.v1.trainer_mode=sync",
    "reward.reward_manager.source=register",
    "reward.reward_manager.name=naive",
    f"reward.custom_reward_function.path={Path(__file__).with_name('stock_reward.py')}",
    "reward.custom_reward_function.name=compute_score",
]
"""verl overrides of the stock arm: verl's own trainer, reward manager and a plain reward."""
LAYER_PHASES = (
    ("generation", ["timing_s/gen"]),
    ("  reward", ["bench/agent_loop/compute_score/sum"]),
    ("weight sync", ["timing_s/update_weights"]),
    ("old log-prob", ["timing_s/old_log_prob"]),
    ("advantage", ["timing_s/adv"]),
    ("update", ["timing_s/update_actor"]),
    ("step", ["timing_s/step"]),
)
"""Rows of part 2: label and verl's metrics (the reward: each rollout's own scoring, summed)."""


def verl_layer(args: argparse.Namespace, root: Path) -> None:
    """Part 2: stock verl grpo against slca-exp's slca_grpo, both on verl's vLLM rollout."""
    import verl_cpu

    sft = argparse.Namespace(steps=args.verl_sft_steps, batch_size=8, lr=5e-3)
    policy, _, _ = verl_cpu.build_policy(root, sft)
    env = verl_cpu.thread_env(1)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    times = {}
    for arm, extra, raw in (
        ("slca-exp", ["algorithm.name=slca_grpo", "tracking.rollouts.every=1"], ()),
        ("stock", ["algorithm.name=grpo", "tracking.rollouts.every=0"], STOCK),
    ):
        name = f"layer-{arm}"
        launched = time.time()
        verl_cpu.train(
            [
                *verl_cpu.common_overrides(root, policy, name),
                *verl_cpu.verl_overrides(args.verl_steps, 0.1, 1, raw),
                "engine.verl.cpu_rollout=vllm",
                *extra,
            ],
            root,
            name,
            env,
        )
        times[arm] = verl_cpu.RunTimes(uri, name, launched, time.time(), os.getloadavg()[:2])
    ours, stock = times["slca-exp"], times["stock"]
    logged = ours.history(names.PERF_ROLLOUT_LOG_S)
    print(
        "\n2. slca-exp's layer over verl (vLLM rollout on CPU): slca_grpo with rollouts logged "
        "at every step vs stock verl grpo,\n   per RL step, ms (median of steps 2..)"
    )
    print(f"   {'phase':<14} {'slca-exp':>10} {'stock':>10} {'ratio':>7}")
    for label, metrics in LAYER_PHASES:
        a, b = ours.values(metrics), stock.values(metrics)
        if not a or not b:
            continue
        ma, mb = statistics.median(a[1:] or a), statistics.median(b[1:] or b)
        flag = "  over the goal" if label == "step" and ma > mb * (1 + GOAL_LAYER) else ""
        shown = f"{ma / mb:6.2f}x" if mb > 0 else "     -"
        print(f"   {label:<14} {ma * 1e3:10.1f} {mb * 1e3:10.1f} {shown}{flag}")
    a, b = ours.values(["response_length/mean"]), stock.values(["response_length/mean"])
    if a and b:  # the same recipe, but each arm's policy writes its own rollouts after step 1
        ma, mb = statistics.median(a[1:] or a), statistics.median(b[1:] or b)
        print(f"   {'tokens/rollout':<14} {ma:10.1f} {mb:10.1f} {ma / mb:6.2f}x  (response length)")
    if logged:
        per_step = statistics.median([v for _, v, _ in logged[1:]] or [logged[0][1]])
        print(f"   rollout logging (inside the step above): {per_step * 1e3:.1f} ms per logged "
              f"step, {len(logged)} steps logged")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rl-steps", type=int, default=30)
    parser.add_argument("--sft-steps", type=int, default=400, help="the smoke recipe's SFT")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--per-step", type=int, default=4, help="tracking.rollouts.per_step")
    parser.add_argument("--verl", action="store_true", help="also part 2 (verl, minutes)")
    parser.add_argument("--verl-only", action="store_true", help="part 2 alone")
    parser.add_argument("--verl-steps", type=int, default=6)
    parser.add_argument("--verl-sft-steps", type=int, default=80)
    parser.add_argument("--quick", action="store_true", help="a few steps: that it runs")
    parser.add_argument("--json", type=Path, help="also write part 1's figures here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rl_steps, args.sft_steps, args.rows = 8, 20, 32
        args.verl_steps, args.verl_sft_steps = 2, 10
    with tempfile.TemporaryDirectory(prefix="slca-rollout-cost-") as tmp:
        if not args.verl_only:
            figures = local_cost(args, Path(tmp))
            if args.json:
                args.json.write_text(json.dumps(figures))
        if args.verl or args.verl_only:
            verl_layer(args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
