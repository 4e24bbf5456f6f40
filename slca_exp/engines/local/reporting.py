"""What a local run reports as it goes, besides its checkpoint and rollouts.

A step's metrics (the cut-off fraction, the simulator's counts, the seconds of each phase), the
trackers' other hooks (advantage samples, run ids, the MLflow tag an outage sets) and the
progress bar on stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from slca_exp.config.schema import RunConfig
from slca_exp.core import names
from slca_exp.engines.local.rollout import Rollouts


def fraction(flags: Sequence[bool]) -> float:
    """The share of true flags (0 for none): ``segment/cutoff_frac`` of a batch."""
    return sum(map(bool, flags)) / max(len(flags), 1)


def service_stats(rolls: Rollouts) -> dict[str, float]:
    """The simulator's counts of a batch's tool calls that are metrics of ours."""
    from slca_exp.simulators import batch_stats as sim_stats

    stats = dict(sim_stats(rolls.tool_results)) if rolls.tool_results else {}
    return {k: v for k, v in stats.items() if k in names.METRICS}


def timing(rolls: Rollouts, reward: float, adv: float, update: float) -> dict[str, float]:
    """Per-phase seconds of a step (``perf/time/*``)."""
    t = rolls.timings
    return {
        names.perf_time("generate"): t["generate"],
        names.perf_time("simulate"): t["simulate"],
        names.perf_time("reward"): reward,
        names.perf_time("advantage"): adv,
        names.perf_time("update"): update,
    }


def log_advantages(tracker: Any, adv: Any, step: int) -> None:  # noqa: ANN401
    """Hand a step's advantage samples to the tracker, when it plots them."""
    log = getattr(tracker, "log_advantages", None)
    if log is None:
        return
    from slca_exp.tracking.plots import advantage_samples

    log(advantage_samples(adv), step)


def run_tagger(config: RunConfig, tracker: Any) -> Any:  # noqa: ANN401
    """Sets a tag of the run's MLflow run (None without one): what an outage is recorded as."""
    run_id = run_ids(tracker).get("mlflow")
    if not run_id:
        return None
    from mlflow.tracking import MlflowClient

    from slca_exp.tracking.mlflow import store_uri

    client = MlflowClient(store_uri(config.tracking))
    return lambda key, value: client.set_tag(run_id, key, value)


def run_ids(tracker: Any) -> dict[str, str]:  # noqa: ANN401
    """The tracker's run ids by tracker name; ``{}`` when it has none."""
    ids = getattr(tracker, "run_ids", None)
    return dict(ids()) if callable(ids) else {}


class Progress:
    """A tqdm bar on stderr with live stats (silent when ``enabled`` is false)."""

    def __init__(self, total: int, label: str, enabled: bool, start: int = 0) -> None:
        self.bar = None
        if enabled and total:
            from tqdm import tqdm

            # disable=None: a bar on a terminal, nothing in a log file
            self.bar = tqdm(
                total=total, initial=start, desc=label, file=sys.stderr, disable=None, leave=True
            )

    def update(self, stats: dict[str, float]) -> None:
        """Count one step done and show ``stats`` beside the bar."""
        if self.bar is not None:
            self.bar.set_postfix({k: f"{v:.3f}" for k, v in stats.items()}, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        """Close the bar (nothing when silent)."""
        if self.bar is not None:
            self.bar.close()
