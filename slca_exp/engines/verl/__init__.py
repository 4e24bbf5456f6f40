"""``engine=verl``: SLCA-GRPO, HierR, the judge and the simulator plugged into unmodified verl.

The run, on this side (the driver):

- ``engine.py``: the engine: check, prepare, the SFT stage, then verl's PPO trainer.
- ``schema.py``: the engine's settings (``engine.verl``), validated with the run config.
- ``rl_config.py``: the run config translated into a complete verl PPO trainer config.
- ``sft_config.py``: the same for verl's SFT trainer (the SFT stage), and where its weights land.
- ``translation.py``: what both translations share (compose, set, override; backend, model
  path, chat template, run name, run folder, the Ray workers' environment).
- ``compose.py``: verl's packaged trainer configs, found without importing verl, composed
  with Hydra.
- ``overrides.py``: ``engine.verl.overrides`` and ``sft_overrides`` applied with Hydra's syntax.
- ``problems.py``: problems on verl's keys told in ours (the fix names the key to change).
- ``checks.py``: verl's own checks of both translated configs, on CPU, before anything starts.
- ``keys.py``: the verl keys and ``<run folder>/verl`` file names both sides agree on.
- ``side_files.py``: the agent-loop and tool configs, the data copies and the config YAML.
- ``sft.py``: the SFT stage run with verl's Ray SFT trainer.
- ``tracker_runs.py``: verl's loggers pointed at our tracker runs; the ids a requeue continues.
- ``ray_cluster.py``: the GPUs the Ray cluster has, and the cpu backend's Ray session.
- ``stopping.py``: stopping verl's trainer at a step boundary for a requeue, and resuming it.

What verl's processes load (the worker side):

- ``plugin.py``: what verl's processes import (``VERL_USE_EXTERNAL_MODULES`` or the
  ``verl.plugins`` entry point) and the early check that the estimator is registered.
- ``estimators.py``: ``slca_grpo`` and ``toolpo_grpo`` in verl's advantage-estimator registry.
- ``scores.py``: each segment's score read off verl's token-level rewards.
- ``trainer.py``: ``slca_sync``, verl's synchronous trainer plus our per-segment metrics.
- ``grad_cos.py``: ``engine.rl.grad_cos`` in verl's actor: its worker, with the training worker
  that measures the gradient conflict before each update.
- ``reward_infos.py``: the reward side's rows as the trainer reads them: flags, scores, metrics.
- ``rewards.py``: ``SLCARewardManager`` (HierR and the judge per trajectory) and the reward
  metrics rebuilt from what it wrote.
- ``agent_loop.py``: verl's tool agent loop, its output carrying both segment scores.
- ``tools.py``: the simulator as verl tools, and the tool config generated from the split.
- ``sft_data.py``: the SFT split as verl's multi-turn SFT dataset reads it, and that dataset.
- ``cpu/``: the cpu backend (``engine.verl.backend=cpu``): a platform, a rollout server and
  the settings that let verl's own trainers run with no accelerator.

Nothing here imports verl at package import time: composing a recipe never pays for it.
"""
