"""A plugin module (``SLCA_EXP_PLUGINS``) that installs ``steps``: an engine that only logs.

Each step logs ``STEPS_METRICS`` metrics (default 20) named ``extra/<i>``, for ``SYNTH_STEPS``
steps (default 5); the value of metric ``i`` at step ``s`` is ``s + i / 1000``, so a reader can
tell every row apart. No model and no torch: many of these processes can run at once cheaply,
which is what the concurrency tests need.
"""

import os

from slca_exp.engines import ENGINES


def step_values(step: int, count: int) -> dict[str, float]:
    """The metrics of one step."""
    return {f"extra/{i}": step + i / 1000 for i in range(count)}


class StepsEngine:
    """An engine with the engine signature that logs :func:`step_values` for every step."""

    def run(self, config, recipe, tracker):
        steps = int(os.environ.get("SYNTH_STEPS", "5"))
        count = int(os.environ.get("STEPS_METRICS", "20"))
        for step in range(steps):
            tracker.log_metrics(step_values(step, count), step)
        return {"steps": steps}


if "steps" not in ENGINES:
    ENGINES.register("steps", StepsEngine())
