"""Per-step metrics from the real estimators on random batches, and an engine that logs them.

No engine is installed yet, so the trackers are driven by :class:`SyntheticEngine`: every step
draws a random multi-turn batch, scores it, runs the configured estimator and logs its stats
with the reward means, under the names of ``slca_exp.core.names``.

Environment knobs (read by the engine, for subprocess tests): ``SYNTH_STEPS`` (default 5),
``SYNTH_SLEEP_S`` (pause per step), ``SYNTH_FAIL_AT`` (raise at that step).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import torch

from slca_exp.core import names
from slca_exp.estimators import EstimatorParams, RolloutScores, get_estimator
from slca_exp.tracking.plots import advantage_samples


def random_batch(step: int, batch: int = 32, length: int = 48, group: int = 4):
    """(response_mask, group_ids, scores): 0-3 tool turns then a summary per rollout."""
    g = torch.Generator().manual_seed(1000 + step)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for b in range(batch):
        pos = 0
        for _ in range(int(torch.randint(0, 4, (1,), generator=g))):
            n = int(torch.randint(2, 6, (1,), generator=g))
            mask[b, pos : pos + n] = 1
            pos += n + 3
        mask[b, pos : pos + int(torch.randint(1, 8, (1,), generator=g))] = 1
    tool = torch.rand(batch, generator=g)
    summary = torch.rand(batch, generator=g)
    summary[torch.rand(batch, generator=g) < 0.1] = float("nan")  # judge failures: absent
    components = torch.rand(batch, 5, generator=g)
    total = tool + torch.nan_to_num(summary)
    ids = torch.arange(batch) // group
    return mask, ids, RolloutScores(tool=tool, summary=summary, total=total), components


def step_metrics(step: int, estimator: str = "slca_grpo"):
    """One step's metrics (real estimator stats + reward means) and the estimator's result."""
    mask, ids, scores, components = random_batch(step)
    result = get_estimator(estimator)(mask, ids, scores, EstimatorParams())
    summary = scores.summary[torch.isfinite(scores.summary)]
    metrics = dict(result.stats)
    metrics.update(
        {
            "reward/tool/mean": float(scores.tool.mean()),
            "reward/tool/std": float(scores.tool.std()),
            "reward/summary/mean": float(summary.mean()),
            "reward/summary/std": float(summary.std()),
            "reward/total/mean": float(scores.total.mean()),
            "reward/no_call/frac": 0.0,
            "val/success@0.9": float((scores.total / 2 >= 0.9).float().mean()),
        }
    )
    for i, part in enumerate(names.TOOL_COMPONENTS):
        metrics[f"reward/tool/{part}/mean"] = float(components[:, i].mean())
    assert set(metrics) <= set(names.METRICS) | {"val/success@0.9"}
    return metrics, result


class SyntheticEngine:
    """An engine with the engine signature that logs synthetic steps to the tracker, then a
    small stand-in policy folder as the run's model (as the real engines do)."""

    def run(self, config, recipe, tracker):
        steps = int(os.environ.get("SYNTH_STEPS", "5"))
        pause = float(os.environ.get("SYNTH_SLEEP_S", "0"))
        fail_at = int(os.environ.get("SYNTH_FAIL_AT", "-1"))
        print(f"synthetic engine: {steps} steps", flush=True)
        for step in range(steps):
            if step == fail_at:
                raise RuntimeError(f"synthetic failure at step {step}")
            metrics, result = step_metrics(step, config.algorithm.name)
            tracker.log_metrics(metrics, step)
            tracker.log_advantages(advantage_samples(result), step)
            print(f"step {step} logged", flush=True)
            time.sleep(pause)
        with tempfile.TemporaryDirectory(prefix="synthetic-policy-") as folder:
            (Path(folder) / "config.json").write_text(json.dumps({"steps": steps}))
            tracker.log_model(folder, name="policy", step=max(steps - 1, 0))
        return {"steps": steps}
