"""``engine=local``'s config: every engine setting, with the local engine's own checks.

The local engine trains in this process, on this host: it loads the backbone's weights here (a
hub backbone missing from this host's cache is refused before anything starts), and it splits
each RL step's rollouts into ``engine.rl.minibatches`` updates, so there must be a rollout for
each. It imports nothing heavy, so composing and validating a recipe stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from omegaconf import DictConfig

from slca_exp.config.schema import EngineConfig
from slca_exp.core.problems import Problem


@dataclass
class LocalEngineConfig(EngineConfig):
    """``engine=local``: CPU or one GPU, in this process."""

    weights_on_this_host: ClassVar[bool] = True

    @classmethod
    def problems(cls, cfg: DictConfig) -> list[Problem]:
        """An RL step's rollouts must fill ``engine.rl.minibatches`` updates, one rollout each."""
        engine = cfg.engine
        if not engine.rl.enabled:
            return []
        prompts, group = engine.rollout.prompts_per_step, cfg.algorithm.group_size
        rollouts, wanted = prompts * group, engine.rl.minibatches
        if wanted <= rollouts:
            return []
        return [
            Problem(
                "engine.rl.minibatches",
                f"{wanted} minibatches cannot be filled from the {rollouts} rollouts of an RL "
                f"step (engine.rollout.prompts_per_step={prompts} x "
                f"algorithm.group_size={group})",
                f"set engine.rl.minibatches to at most {rollouts}, or roll out more per step "
                "(engine.rollout.prompts_per_step, algorithm.group_size)",
            )
        ]
