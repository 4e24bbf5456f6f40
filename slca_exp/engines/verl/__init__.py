"""``engine=verl``: SLCA-GRPO, HierR, the judge and the simulator plugged into unmodified verl.

- ``estimators.py``: ``slca_grpo`` and ``toolpo_grpo`` in verl's advantage-estimator registry.
- ``plugin.py``: what verl's processes import (``VERL_USE_EXTERNAL_MODULES`` or the
  ``verl.plugins`` entry point) and the early check that the estimator is registered.
- ``config.py``: the run config translated into a complete verl PPO trainer config.

Nothing here imports verl at package import time: composing a recipe never pays for it.
"""
