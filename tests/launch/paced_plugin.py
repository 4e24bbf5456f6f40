"""A plugin module (``SLCA_EXP_PLUGINS``) that installs the local engine, paced, as ``paced_local``.

Each RL step takes at least ``PACE_S`` seconds (steps that take longer are not slowed): a test
that must catch a run in the middle of its steps (SLURM's time-limit signal) then does not
depend on how fast the machine computes them, and a loaded machine does not pay twice. A
requeued SLURM job (``SLURM_RESTART_COUNT`` > 0) paces its steps at ``PACE_RESUMED_S`` when that
is set: there is nothing left to catch once the job has been requeued.
Everything else is the local engine: checkpoints, resume, trackers.
"""

import os
import time
from typing import Any

from slca_exp.engines import ENGINES
from slca_exp.engines.local.engine import LocalEngine


class PacedTracker:
    """The run's tracker, recording each step no sooner than ``pace_s`` after the previous one."""

    def __init__(self, tracker: Any, pace_s: float) -> None:
        self._tracker = tracker
        self._pace_s = pace_s
        self._last = time.monotonic()

    def log_metrics(self, metrics, step):
        time.sleep(max(0.0, self._last + self._pace_s - time.monotonic()))
        self._last = time.monotonic()
        self._tracker.log_metrics(metrics, step)

    def __getattr__(self, name):
        return getattr(self._tracker, name)


class PacedLocalEngine(LocalEngine):
    def run(self, config, recipe, tracker):
        pace = os.environ["PACE_S"]
        if int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0:
            pace = os.environ.get("PACE_RESUMED_S", pace)
        return super().run(config, recipe, PacedTracker(tracker, float(pace)))


ENGINES.register("paced_local", PacedLocalEngine())
