"""A plugin module (``SLCA_EXP_PLUGINS``) that installs the local engine, paced, as ``paced_local``.

Each RL step takes at least ``PACE_S`` seconds longer than it would: a test that must catch a
run in the middle of its steps (SLURM's time-limit signal) then does not depend on how fast the
machine computes them. Everything else is the local engine: checkpoints, resume, trackers.
"""

import os
import time
from typing import Any

from slca_exp.engines import ENGINES
from slca_exp.engines.local.engine import LocalEngine


class PacedTracker:
    """The run's tracker, sleeping ``pace_s`` before each step it records."""

    def __init__(self, tracker: Any, pace_s: float) -> None:
        self._tracker = tracker
        self._pace_s = pace_s

    def log_metrics(self, metrics, step):
        time.sleep(self._pace_s)
        self._tracker.log_metrics(metrics, step)

    def __getattr__(self, name):
        return getattr(self._tracker, name)


class PacedLocalEngine(LocalEngine):
    def run(self, config, recipe, tracker):
        return super().run(config, recipe, PacedTracker(tracker, float(os.environ["PACE_S"])))


ENGINES.register("paced_local", PacedLocalEngine())
