"""One RL update of the local engine: old log-probs, then epochs x minibatches of clipped PG."""

from __future__ import annotations

import torch

from slca_exp.config.schema import RLConfig
from slca_exp.engines.local.policy import flat_grad, masked_mean, pg_loss, response_logprobs
from slca_exp.engines.local.rollout import PackedBatch
from slca_exp.estimators.types import SegmentAdvantages
from slca_exp.tracking import names


def rl_update(
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    batch: PackedBatch,
    adv: SegmentAdvantages,
    cfg: RLConfig,
    temperature: float,
) -> dict[str, float]:
    """Update ``model`` on one batch of rollouts; returns the ``train/*`` metrics.

    The log-probs of the sampling policy are recomputed once before the first update (the
    policy that generated the batch is the current one), so the first minibatch has ratio 1 and
    clipping acts from the second on, as in verl.
    """
    device = batch.input_ids.device
    mask = batch.response_mask.to(device)
    advantages = adv.advantages.to(device)
    with torch.no_grad():
        old_logp, _ = response_logprobs(model, batch, temperature)
        ref_logp = None
        if reference is not None and cfg.kl_coef > 0:
            ref_logp, _ = response_logprobs(reference, batch, temperature)
    stats: dict[str, float] = {}
    if cfg.grad_cos:
        stats[names.TRAIN_GRAD_COS] = _grad_cos(
            model, batch, old_logp, advantages, adv, cfg, temperature
        )
    b = batch.input_ids.shape[0]
    losses, kls, entropies, norms = [], [], [], []
    for _ in range(cfg.epochs):
        order = torch.randperm(b)
        for chunk in order.chunk(cfg.minibatches):
            sub = _select(batch, chunk)
            logp, entropy = response_logprobs(model, sub, temperature, entropy=True)
            parts = pg_loss(
                logp,
                old_logp[chunk],
                advantages[chunk],
                mask[chunk],
                clip_ratio=cfg.clip_ratio,
                ref_logp=None if ref_logp is None else ref_logp[chunk],
                kl_coef=cfg.kl_coef,
            )
            optimizer.zero_grad(set_to_none=True)
            parts.loss.backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)))
            optimizer.step()
            losses.append(float(parts.loss.detach()))
            kls.append(parts.kl)
            assert entropy is not None
            entropies.append(float(masked_mean(entropy.detach(), mask[chunk])))
    stats.update(
        {
            "train/loss": sum(losses) / len(losses),
            "train/kl": sum(kls) / len(kls),
            "train/entropy": sum(entropies) / len(entropies),
            "train/grad_norm": sum(norms) / len(norms),
            "train/lr": optimizer.param_groups[0]["lr"],
        }
    )
    return stats


def _select(batch: PackedBatch, rows: torch.Tensor) -> PackedBatch:
    return PackedBatch(
        batch.input_ids[rows],
        batch.attention_mask[rows],
        batch.response_mask[rows],
        batch.prompt_len,
    )


def _grad_cos(
    model: torch.nn.Module,
    batch: PackedBatch,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    adv: SegmentAdvantages,
    cfg: RLConfig,
    temperature: float,
) -> float:
    """cos(grad_tool, grad_summary), the paper's appendix diagnostic.

    The policy-gradient loss restricted to each segment's tokens, one backward pass each on the
    whole batch. NaN when a segment is absent everywhere.
    """
    grads = []
    for seg_mask in (adv.tool_mask, adv.summary_mask):
        seg = seg_mask.to(advantages.device)
        if not bool(seg.any()):
            return float("nan")
        model.zero_grad(set_to_none=True)
        logp, _ = response_logprobs(model, batch, temperature)
        pg_loss(logp, old_logp, advantages, seg, clip_ratio=cfg.clip_ratio).loss.backward()
        grads.append(flat_grad(model))
    model.zero_grad(set_to_none=True)
    cos = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0)
    return float(cos)
