"""Names both sides of the verl engine agree on: verl config keys and ``<run folder>/verl`` files.

The translation (``rl_config.py``, ``sft_config.py``) writes them; the worker side (the reward
manager, the trainer, the stop request) and the launch read them back. Nothing here imports
anything, so every module of the package may take its names from here.
"""

from __future__ import annotations

ACTOR, REF = "actor_rollout_ref.actor.", "actor_rollout_ref.ref."
ROLLOUT, TURNS = "actor_rollout_ref.rollout.", "actor_rollout_ref.rollout.multi_turn."
"""Prefixes of verl's actor, reference, rollout and multi-turn keys."""

OUR_KEY = "slca_exp"
"""Top-level section with our reward, judge and simulator configs (read by the reward manager)."""
GRAD_COS_KEY = f"{OUR_KEY}.grad_cos"
"""``engine.rl.grad_cos``: verl's actor measures the gradient conflict (``grad_cos.py``)."""
PARAMS_KEY = "algorithm.slca"
"""Our estimator hyper-parameters (``EstimatorParams`` fields, and ``mask_rule``)."""
ENV_VARS_KEY = "ray_kwargs.ray_init.runtime_env.env_vars"
"""Where the Ray workers' environment variables go in verl's config."""
MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
"""The variable naming the modules every verl process imports."""
PLUGIN_MODULE = "slca_exp.engines.verl.plugin"
"""What every verl process must import (it registers our estimators)."""
VERL_AGENT_LOOP = "tool_agent"
"""verl's own multi-turn tool agent loop (the one verl's own estimators get)."""

CONFIG_FILE = "ppo_trainer.yaml"
"""``<run folder>/verl/ppo_trainer.yaml``: the translated RL config verl runs."""
SFT_CONFIG_FILE = "sft_trainer.yaml"
"""``<run folder>/verl/sft_trainer.yaml``: the translated SFT config."""
TOOLS_FILE = "tools.yaml"
AGENT_LOOPS_FILE = "agent_loops.yaml"
ROLLOUT_LOG = "rollout_weights.jsonl"
"""``<run folder>/verl/rollout_weights.jsonl``: the cpu backend's weight updates of its server."""
BATCHES_DIR = "batches"
"""``<run folder>/verl/batches``: each step's batch (``engine.verl.dump_batches``)."""
DATA_DIR = "data"
"""``<run folder>/verl/data``: the splits as verl reads them (``extra_info.tools_kwargs`` added)."""
CHECKPOINTS_DIR = "checkpoints"
"""``<run folder>/verl/checkpoints``: verl's RL checkpoints (``trainer.default_local_dir``)."""
