"""The replay buffer ``benchmarks/verl_cpu.py`` gives verl's trainer: verl's own, timed.

verl's synchronous trainer takes each step's rollouts from a replay buffer over the
TransferQueue, which its agent loops fill as rollouts finish. verl lets a run name its own
buffer class (``trainer.v1.sampler.custom_sampler.path`` = this file, ``.name`` =
``PolledReplayBuffer``); verl's trainer loads this file in its own process. The class changes
two things, both for measuring:

- the poll: verl's buffer checks the TransferQueue, then sleeps ``poll_interval`` (2 s) between
  checks, so ``timing_s/gen`` is a multiple of 2 s once a step's rollouts take longer than the
  first check; ``trainer.v1.sampler.sampler_kwargs.poll_interval`` sets a shorter one;
- the agent loops' own timings: each rollout records its seconds generating, calling tools and
  being scored (``AgentLoopMetrics``) next to its tokens in the TransferQueue, where verl's
  trainer leaves them; they are read back for the sampled rollouts and logged, summed over them,
  with the step's metrics (``bench/agent_loop/<name>/sum``).

Which rollouts are sampled, and everything else, is verl's. verl gives its own buffer a few
arguments it does not give a custom one (for group filtering and for refilling failed groups);
both features are off in verl's defaults, which this project keeps, so the buffer behaves as
verl's default one.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer  # noqa: E402

from benchmarks.verl_cpu import AGENT_LOOP_KEY, AGENT_LOOP_TIMINGS  # noqa: E402


class PolledReplayBuffer(ReplayBuffer):
    """verl's synchronous replay buffer, with its poll interval set and the rollouts' timings."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401 - verl's signature
        """verl's constructor, with ``poll_interval`` taken from ``sampler_kwargs`` when given."""
        poll = (kwargs.get("sampler_kwargs") or {}).get("poll_interval")
        if poll is not None:
            kwargs["poll_interval"] = float(poll)
        super().__init__(*args, **kwargs)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        """verl's sample; for a training batch, also its rollouts' own timings, summed."""
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        if partition_id == "train" and batch.keys:
            import transfer_queue as tq

            data = tq.kv_batch_get(
                keys=batch.keys, partition_id=partition_id, select_fields=["metrics"]
            )
            metrics.update(agent_loop_sums(data.pop("metrics").tolist()))
        return batch, metrics


def agent_loop_sums(rows: Sequence[Any]) -> dict[str, float]:
    """Each agent-loop timing summed over the rollouts (a rollout without it counts 0).

    >>> agent_loop_sums([{"tool_calls": 0.5, "compute_score": 0.1}, {"tool_calls": 0.25}])
    ... # doctest: +NORMALIZE_WHITESPACE
    {'bench/agent_loop/generate_sequences/sum': 0.0, 'bench/agent_loop/tool_calls/sum': 0.75,
     'bench/agent_loop/compute_score/sum': 0.1}
    """
    found = [r if isinstance(r, Mapping) else {} for r in rows]
    return {
        AGENT_LOOP_KEY.format(name): float(sum(float(r.get(name) or 0.0) for r in found))
        for name in AGENT_LOOP_TIMINGS
    }
