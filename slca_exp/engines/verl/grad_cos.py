"""``engine.rl.grad_cos`` on verl: the gradient-conflict diagnostic, inside verl's own actor.

What the local engine measures (``engines/local/update.py``), measured on verl: at every actor
update, before verl's own update of the step's batch, two extra forward-backward passes through
verl's training engine, each with the policy-gradient loss restricted to one segment's tokens,
then the cosine of the two gradients and their norms. Nothing of verl is patched; the run asks
for verl's actor worker with one class attribute changed:

    slca_exp.grad_cos: true       (the translated config; ``rl_config.py``)
      -> SLCATrainer._init_resource_pool_mgr (``trainer.py``): the actor role's worker class is
         :class:`GradCosActorWorker`, verl's ``ActorRolloutRefWorker`` whose
         ``actor_worker_cls`` is :class:`GradCosTrainingWorker`
      -> update_actor -> train_mini_batch(the step's batch, this data-parallel rank's share):
           the segments: ``split_segments`` of the response mask, rollouts the reward side
           flagged as having no summary (``mask_rule=corrected``) all tool, as the estimator
           splits them
           tool pass, summary pass: verl's ``forward_backward_batch`` with :func:`segment_pg_loss`
           cos, |g_tool|, |g_summary| from the gradient shards (summed over the shard group)
           -> then verl's own update, unchanged; the three values join its metrics
      -> SLCATrainer._update_actor: ``actor/<key>`` (:data:`ACTOR_KEYS`) logged as
         ``train/grad_cos``, ``train/grad_norm_tool``, ``train/grad_norm_summary``

What it measures, as the local engine does: the whole step's batch at the weights the update
starts from; the loss of each pass is verl's policy loss (``actor.policy_loss.loss_mode``,
``loss_agg_mode``; no entropy or KL term) over that segment's tokens only, normalised by that
segment's token count. A segment with no token anywhere in the batch gets no pass, norm 0 and a
NaN cosine; a zero gradient (no token with an advantage) a cosine of 0. The public SLCA-GRPO code
measures the first micro-batch of each mini-batch instead.

:func:`check_internals` names the verl internals this leans on.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.trainer.ppo.utils import Role
from verl.utils import tensordict_utils as tu
from verl.utils.device import get_device_id
from verl.utils.tensordict_utils import maybe_fix_3d_position_ids
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker
from verl.workers.utils.padding import no_padding_2_padding

from slca_exp.core import names
from slca_exp.engines.verl.keys import GRAD_COS_KEY
from slca_exp.engines.verl.reward_infos import no_summary_rows
from slca_exp.engines.verl.rewards import batch_infos
from slca_exp.estimators.segments import split_segments

SWITCH_KEY = GRAD_COS_KEY
"""The translated config's switch (``engine.rl.grad_cos``), read by the trainer."""
ACTOR_KEYS: dict[str, str] = {
    "slca_grad_cos": names.TRAIN_GRAD_COS,
    "slca_grad_norm_tool": names.TRAIN_GRAD_NORM_TOOL,
    "slca_grad_norm_summary": names.TRAIN_GRAD_NORM_SUMMARY,
}
"""The actor's metric key -> our name (verl's trainer logs the actor's as ``actor/<key>``)."""
ACTOR_PREFIX = "actor/"
ACTOR_ROLES = (Role.Actor, Role.ActorRollout, Role.ActorRolloutRef)
"""verl's roles whose worker holds the trained actor."""


def enabled(config: Any) -> bool:  # noqa: ANN401 - verl's DictConfig
    """Whether the run asks for the diagnostic (:data:`SWITCH_KEY`)."""
    return bool(OmegaConf.select(config, SWITCH_KEY, default=False))


def use_measuring_worker(role_worker_mapping: MutableMapping[Any, Any]) -> None:
    """Give the actor's roles :class:`GradCosActorWorker` (verl's trainer builds them from this)."""
    import ray

    for role in ACTOR_ROLES:
        if role in role_worker_mapping:
            role_worker_mapping[role] = ray.remote(GradCosActorWorker)


def our_metrics(metrics: MutableMapping[str, Any]) -> dict[str, float]:
    """Take the diagnostic's ``actor/<key>`` values out of verl's step metrics, under our names."""
    return {
        ours: float(metrics.pop(ACTOR_PREFIX + key))
        for key, ours in ACTOR_KEYS.items()
        if ACTOR_PREFIX + key in metrics
    }


def segment_pg_loss(
    config: Any,  # noqa: ANN401 - verl's ActorConfig
    model_output: Mapping[str, torch.Tensor],
    data: TensorDict,
    dp_group: Any = None,  # noqa: ANN401
) -> tuple[torch.Tensor, dict]:
    """The policy loss of verl's actor (no entropy or KL term) over ``data``'s response mask.

    ``verl.workers.utils.losses.ppo_loss`` computes the same policy loss first; here the
    response mask holds one segment's tokens and ``batch_num_tokens`` counts them (the
    token-mean is over the segment's tokens of the whole batch, on every rank).
    """
    del dp_group
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    config.global_batch_info.update(
        dp_size=data["dp_size"],
        batch_num_tokens=data["batch_num_tokens"],
        global_batch_size=data["global_batch_size"],
        loss_scale_factor=config.loss_scale_factor,
    )
    fields = ["response_mask", "old_log_probs", "advantages"]
    fields += ["rollout_is_weights"] if "rollout_is_weights" in data else []
    padded = data.select(*fields).to_padded_tensor()
    loss_fn = get_policy_loss_fn(config.policy_loss.get("loss_mode", "vanilla"))
    loss, _ = loss_fn(
        old_log_prob=padded["old_log_probs"],
        log_prob=log_prob,
        advantages=padded["advantages"],
        response_mask=padded["response_mask"].bool(),
        loss_agg_mode=config.loss_agg_mode,
        config=config,
        rollout_is_weights=padded.get("rollout_is_weights", None),
    )
    return loss, {}


class GradCosTrainingWorker(TrainingWorker):
    """verl's training worker; each update first measures the gradient conflict (module doc)."""

    actor_config: Any = None
    """The actor's ``ActorConfig``: the keyword of the loss verl's actor worker hands over."""

    def set_loss_fn(self, loss_fn: Any) -> None:  # noqa: ANN401 - functools.partial
        """Keep verl's loss, and the actor config it is bound to (the policy loss's settings)."""
        super().set_loss_fn(loss_fn)
        self.actor_config = getattr(loss_fn, "keywords", {}).get("config")

    def train_mini_batch(self, data: TensorDict) -> TensorDict | None:
        """The diagnostic on the step's batch, then verl's own update; both in its metrics."""
        found = self.grad_conflict(data)
        output = super().train_mini_batch(data)
        if output is None:
            return None
        metrics = dict(tu.get(output, "metrics"))
        metrics.update({key: [value] for key, value in found.items()})
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})

    def grad_conflict(self, data: TensorDict) -> dict[str, float]:
        """cos(g_tool, g_summary), |g_tool| and |g_summary| on ``data``, under :data:`ACTOR_KEYS`.

        ``data`` is what ``train_mini_batch`` receives (verl's no-padding layout, the trainer's
        ``extra_info`` as non-tensor entries); it is not changed. The gradients are left zeroed.
        """
        if self.actor_config is None:
            raise RuntimeError(
                "engine.rl.grad_cos: verl's actor worker handed its training worker no loss "
                f"bound to an actor config (verl {_verl_version()}); set engine.rl.grad_cos=false"
            )
        engine = self.engine
        response_mask = data["response_mask"]  # (B, j) nested; (B, T) when rows are equally long
        padded = response_mask.to_padded_tensor(0) if response_mask.is_nested else response_mask
        split = split_segments(padded)
        flags = torch.as_tensor(no_summary_flags(data))
        if flags.any():
            split = split.without_summary(flags)
        disable = tu.get(data, "disable_auto_offload", default=False)
        snapshot: list[torch.Tensor | None] | None = None
        sums = torch.zeros(3, dtype=torch.float64)  # dot, |g_tool|^2, |g_summary|^2
        passes = 0
        with engine.train_mode(disable_auto_offload=disable):
            for index, mask in enumerate((split.tool_mask, split.summary_mask)):
                part = self._segment_batch(data, mask)
                if part is None:  # no token of this segment on any rank: its gradient is 0
                    continue
                passes += 1
                engine.optimizer_zero_grad()
                engine.forward_backward_batch(part, loss_function=self._segment_loss)
                grads = _local_grads(engine.module)
                if index == 0:
                    snapshot = [None if g is None else g.detach().clone() for g in grads]
                    sums[1] = _dot(grads, grads)
                else:
                    sums[2] = _dot(grads, grads)
                    if snapshot is not None:
                        sums[0] = _dot(snapshot, grads)
            engine.optimizer_zero_grad()
        sums = _over_shards(engine.module, sums)
        return conflict_metrics(*(float(s) for s in sums), both=passes == 2)

    def _segment_loss(
        self, model_output: Mapping[str, torch.Tensor], data: TensorDict, dp_group: Any = None
    ) -> tuple[torch.Tensor, dict]:  # noqa: ANN401
        return segment_pg_loss(self.actor_config, model_output, data, dp_group)

    def _segment_batch(self, data: TensorDict, mask: torch.Tensor) -> TensorDict | None:
        """A copy of ``data`` whose learnable tokens are ``mask``'s (B, T); ``None``: it has none.

        The engine settings ``train_batch`` fills in are filled in the same way.
        """
        counts = torch.stack([mask.sum(), mask.any(dim=1).sum()]).to(get_device_id())
        if torch.distributed.is_initialized():  # as verl counts a batch's tokens
            group = self.engine.get_data_parallel_group()
            torch.distributed.all_reduce(counts, group=group)
        tokens, rows = (int(c) for c in counts)
        if tokens == 0:
            return None
        like = data["response_mask"]
        if like.is_nested:  # the mask in the batch's own layout
            lengths = like.offsets().diff()
            within = torch.arange(mask.shape[1], device=mask.device) < lengths.unsqueeze(1)
            segment = torch.nested.nested_tensor_from_jagged(
                mask[within].to(like.dtype), offsets=like.offsets()
            )
        else:
            segment = mask.to(like.dtype)
        part = data.copy()
        part["response_mask"] = segment
        part["loss_mask"] = segment
        defaults = {
            "use_remove_padding": self.model_config.get("use_remove_padding", False),
            "use_dynamic_bsz": self.engine_config.use_dynamic_bsz,
            "max_token_len_per_gpu": self.engine_config.max_token_len_per_gpu,
            "micro_batch_size_per_gpu": self.engine_config.micro_batch_size_per_gpu,
            "use_fused_kernels": self.engine_config.use_fused_kernels,
        }
        for key, value in defaults.items():
            if key not in part.keys():  # noqa: SIM118 - a TensorDict
                tu.assign_non_tensor(part, **{key: value})
        tu.assign_non_tensor(part, calculate_entropy=False, global_batch_size=rows)
        maybe_fix_3d_position_ids(part)
        return part


class GradCosActorWorker(ActorRolloutRefWorker):
    """verl's actor (rollout, reference) worker, its actor a :class:`GradCosTrainingWorker`."""

    actor_worker_cls = GradCosTrainingWorker


def no_summary_flags(data: TensorDict) -> list[bool]:
    """(B,) the rollouts the reward side marked as having no summary (``mask_rule=corrected``).

    The flags the trainer hands verl's estimator (``reward_infos.no_summary_rows``), read off
    the same ``extra_fields`` rows.

    Raises:
        RuntimeError: the batch carries no ``extra_fields`` (the segments could not be told).

    """
    extra = tu.get(data, "extra_fields", default=None)
    if extra is None:
        raise RuntimeError(
            "engine.rl.grad_cos: the actor's batch has no extra_fields, so the rollouts "
            "without a summary segment cannot be told; set engine.rl.grad_cos=false"
        )
    return [bool(f) for f in no_summary_rows(batch_infos(list(extra)))]


def conflict_metrics(
    dot: float, tool_sq: float, summary_sq: float, *, both: bool = True
) -> dict[str, float]:
    """The three values under :data:`ACTOR_KEYS` from the gradients' dot product and squares.

    ``both``: each segment had tokens (else the cosine is NaN); a zero gradient's cosine is 0.

    >>> conflict_metrics(-2.0, 4.0, 1.0)
    {'slca_grad_cos': -1.0, 'slca_grad_norm_tool': 2.0, 'slca_grad_norm_summary': 1.0}
    >>> zero = conflict_metrics(0.0, 4.0, 0.0)
    >>> absent = conflict_metrics(0.0, 4.0, 0.0, both=False)
    >>> zero["slca_grad_cos"], absent["slca_grad_cos"], absent["slca_grad_norm_summary"]
    (0.0, nan, 0.0)
    """
    norms = math.sqrt(tool_sq), math.sqrt(summary_sq)
    cos = dot / max(norms[0] * norms[1], 1e-30) if both else math.nan
    keys = list(ACTOR_KEYS)
    return {keys[0]: cos, keys[1]: norms[0], keys[2]: norms[1]}


def _local_grads(module: torch.nn.Module) -> list[torch.Tensor | None]:
    """Each trainable parameter's gradient as this rank holds it (an FSDP2 DTensor's shard)."""
    from torch.distributed.tensor import DTensor

    out = []
    for p in module.parameters():
        if not p.requires_grad:
            continue
        g = p.grad
        out.append(g.to_local() if isinstance(g, DTensor) else g)
    return out


def _dot(a: list[torch.Tensor | None], b: list[torch.Tensor | None]) -> torch.Tensor:
    """sum_i <a_i, b_i> in float64 (a missing gradient is 0)."""
    total = torch.zeros((), dtype=torch.float64)
    for x, y in zip(a, b, strict=True):
        if x is not None and y is not None and x.numel():
            total += torch.sum(x.double() * y.double()).cpu()
    return total


def _over_shards(module: torch.nn.Module, sums: torch.Tensor) -> torch.Tensor:
    """``sums`` of the local gradient shards summed over the ranks that shard the parameters.

    FSDP2: the mesh dimensions its DTensors are sharded on; FSDP1: its process group (the
    sharding group, replicas left out under hybrid sharding); otherwise nothing is sharded.
    """
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return sums
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor, Shard

    out = sums.to(get_device_id())
    if isinstance(module, FullyShardedDataParallel):
        torch.distributed.all_reduce(out, group=module.process_group)
        return out.cpu()
    sharded = next((p for p in module.parameters() if isinstance(p, DTensor)), None)
    if sharded is not None:
        for dim, placement in enumerate(sharded.placements):
            if isinstance(placement, Shard):
                torch.distributed.all_reduce(out, group=sharded.device_mesh.get_group(dim))
    return out.cpu()


def _verl_version() -> str:
    from importlib.metadata import version

    return version("verl")


def check_internals() -> list[str]:
    """What changed, if anything, in the verl internals this diagnostic leans on.

    - ``ActorRolloutRefWorker.actor_worker_cls`` builds the actor's ``TrainingWorker``, which
      its ``update_actor`` calls ``train_mini_batch`` on, after handing it the loss through
      ``set_loss_fn`` as a ``functools.partial`` with ``config=`` (the ``ActorConfig``);
    - the trainer builds the actor's worker from ``role_worker_mapping`` (filled by
      ``_init_resource_pool_mgr``) and logs the actor's metrics with ``actor/`` in front
      (``_update_actor``);
    - ``TrainingWorker.train_batch`` fills in the engine settings :meth:`_segment_batch` copies.
    """
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    found = []
    worker = inspect.getsource(ActorRolloutRefWorker)
    if ActorRolloutRefWorker.actor_worker_cls is not TrainingWorker:
        found.append("ActorRolloutRefWorker.actor_worker_cls is no longer TrainingWorker")
    for needed in ("self.actor_worker_cls(", "self.actor.set_loss_fn(", "train_mini_batch("):
        if needed not in worker:
            found.append(f"ActorRolloutRefWorker no longer calls {needed}...)")
    if "partial(ppo_loss, config=" not in worker:
        found.append("the actor's loss is no longer partial(ppo_loss, config=...)")
    if "role_worker_mapping[role] = ray.remote(ActorRolloutRefWorker)" not in inspect.getsource(
        PPOTrainer._init_resource_pool_mgr
    ):
        found.append("PPOTrainer._init_resource_pool_mgr no longer maps the actor's role")
    if 'rename_dict(output["metrics"], "actor/")' not in inspect.getsource(
        PPOTrainer._update_actor
    ):
        found.append("PPOTrainer._update_actor no longer logs the actor's metrics as actor/*")
    train_batch = inspect.getsource(TrainingWorker.train_batch)
    for key in ("use_remove_padding", "use_dynamic_bsz", "micro_batch_size_per_gpu"):
        if f"{key}=" not in train_batch:
            found.append(f"TrainingWorker.train_batch no longer fills in {key}")
    return [f"{what} (verl {_verl_version()})" for what in found]
