"""Metric logging speed to MLflow (sqlite), side by side in one process.

Competitors, each writing to its own sqlite store in a temporary folder:

  ours   slca_exp.tracking.mlflow.MlflowTracker.log_metrics (one MlflowClient.log_batch per step)
  verl   verl.utils.tracking.Tracking(default_backend="mlflow").log (mlflow.log_metrics)

Every step logs the same ~100 metrics (the names of slca_exp.core.names, with their val/
copies, padded with extra/<i> names). Steps are interleaved (each competitor logs step k before
either logs step k+1), so slow drift of the machine hits both alike; the median and the minimum
time per step are reported, with the ratio ours / verl (below 1: ours is faster). Usage:

    python benchmarks/tracking.py [--steps 300] [--metrics 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slca_exp.core import names  # noqa: E402
from slca_exp.preflight.compose import compose_run  # noqa: E402
from slca_exp.preflight.validate import validate  # noqa: E402
from slca_exp.recipe import build_recipe  # noqa: E402
from slca_exp.tracking.mlflow import MlflowTracker  # noqa: E402
from slca_exp.tracking.redact import Redactor  # noqa: E402


def metric_names(count: int) -> list[str]:
    """``count`` metric names: the catalogue, its ``val/`` copies, then ``extra/<i>`` fillers."""
    pool = list(names.METRICS) + [f"val/{n}" for n in names.METRICS if not n.startswith("val/")]
    pool += [f"extra/{i}" for i in range(max(0, count - len(pool)))]
    return pool[:count]


Competitor = tuple[Callable[[dict[str, float], int], None], Callable[[], None]]
"""(log one step, close the run)."""


def ours(root: Path) -> Competitor:
    """Our tracker on a sqlite store under ``root``."""
    config = validate(compose_run([f"tracking.root={root}", "experiment_name=bench-ours"]))
    tracker = MlflowTracker(config.tracking, "bench", Redactor())
    tracker.start(build_recipe(config), {"seed": config.seed})
    return tracker.log_metrics, lambda: tracker.finish("FINISHED")


def verl(root: Path) -> Competitor:
    """verl's tracker with its MLflow backend on a sqlite store under ``root``."""
    from verl.utils.tracking import Tracking

    # verl reads the store from the environment (its default is /tmp/mlruns.db).
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
    tracking = Tracking(
        project_name="bench-verl",
        experiment_name="bench",
        default_backend="mlflow",
        config={"trainer": {"project_name": "bench-verl"}, "seed": 42},
    )
    return tracking.log, tracking.finish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="steps logged by each competitor")
    parser.add_argument("--metrics", type=int, default=100, help="metrics per step")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    args = parser.parse_args()
    keys = metric_names(args.metrics)
    with tempfile.TemporaryDirectory(prefix="slca-bench-") as tmp:
        competitors = {}
        for name, build in (("ours", ours), ("verl", verl)):
            folder = Path(tmp) / name
            folder.mkdir()
            competitors[name] = build(folder)
        times: dict[str, list[float]] = {n: [] for n in competitors}
        for step in range(args.warmup + args.steps):
            values = {k: (step * 31 + i) % 97 / 97.0 for i, k in enumerate(keys)}
            for name, (log, _) in competitors.items():
                start = time.perf_counter()
                log(values, step)
                if step >= args.warmup:
                    times[name].append(time.perf_counter() - start)
        for _, close in competitors.values():
            close()  # before the stores are deleted
    print(f"MLflow sqlite, {len(keys)} metrics per step, {args.steps} steps (interleaved)")
    print(f"{'tracker':<8} {'median ms/step':>15} {'min ms/step':>12}")
    for name, t in times.items():
        print(f"{name:<8} {statistics.median(t) * 1e3:>15.2f} {min(t) * 1e3:>12.2f}")
    ratio = statistics.median(times["ours"]) / statistics.median(times["verl"])
    verdict = "ours no slower" if ratio <= 1.05 else "ours slower"
    print(f"ratio ours/verl (median): {ratio:.2f}  ({verdict}; within 5% counts as no slower)")


if __name__ == "__main__":
    main()
