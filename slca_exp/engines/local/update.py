"""One RL update of the local engine: old log-probs, then epochs x minibatches of clipped PG.

The tokens it trains are the segments of ``engine.rl.mask_rule`` (:func:`segments`).

As verl's actor: every pass shuffles the rollouts into ``engine.rl.minibatches`` shares and takes
one optimizer step per share, the loss a token-mean over that share (``policy.pg_loss``). A step
whose gradient norm is NaN or infinite is not taken: its gradients are dropped, the optimizer
state is left as it was, and the step is counted in ``train/skipped_steps``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from slca_exp.config.schema import RLConfig
from slca_exp.core import names
from slca_exp.engines.local.policy import masked_mean, pg_loss, response_logprobs
from slca_exp.engines.local.rollout import PackedBatch
from slca_exp.estimators.segments import SegmentSplit, split_segments
from slca_exp.estimators.types import SegmentAdvantages


def rl_update(
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    batch: PackedBatch,
    adv: SegmentAdvantages,
    cfg: RLConfig,
    temperature: float,
    old_logp: torch.Tensor | None = None,
) -> dict[str, float]:
    """Update ``model`` on one batch of rollouts; returns the ``train/*`` metrics.

    The log-probs of the sampling policy are recomputed once before the first update (the
    policy that generated the batch is the current one), so the first minibatch has ratio 1 and
    clipping acts from the second on, as in verl. A caller that computed them already (to log
    them with the step's rollouts) passes them as ``old_logp``: (B, T), ``response_logprobs``
    of ``model`` in its current state.
    """
    device = batch.input_ids.device
    mask = batch.response_mask.to(device)
    advantages = adv.advantages.to(device)
    with torch.no_grad():
        if old_logp is None:
            old_logp, _ = response_logprobs(model, batch, temperature)
        old_logp = old_logp.to(device)
        ref_logp = None
        if reference is not None and cfg.kl_coef > 0:
            ref_logp, _ = response_logprobs(reference, batch, temperature)
    stats: dict[str, float] = {}
    if cfg.grad_cos:
        stats.update(grad_conflict(model, batch, old_logp, advantages, adv, cfg, temperature))
    b = batch.input_ids.shape[0]
    losses, kls, entropies, norms = [], [], [], []
    skipped = 0
    for _ in range(cfg.epochs):
        for rows in minibatch_rows(b, cfg.minibatches):
            sub = _select(batch, rows)
            logp, entropy = response_logprobs(model, sub, temperature, entropy=True)
            parts = pg_loss(
                logp,
                old_logp[rows],
                advantages[rows],
                mask[rows],
                clip_ratio=cfg.clip_ratio,
                clip_ratio_c=cfg.clip_ratio_c,
                ref_logp=None if ref_logp is None else ref_logp[rows],
                kl_coef=cfg.kl_coef,
            )
            optimizer.zero_grad(set_to_none=True)
            parts.loss.backward()
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
            if math.isfinite(norm):
                optimizer.step()
                norms.append(norm)
            else:  # a NaN or infinite gradient would corrupt the weights and Adam's moments
                optimizer.zero_grad(set_to_none=True)
                skipped += 1
            losses.append(float(parts.loss.detach()))
            kls.append(parts.kl)
            assert entropy is not None
            entropies.append(float(masked_mean(entropy.detach(), mask[rows])))
    stats.update(
        {
            names.TRAIN_LOSS: sum(losses) / len(losses),
            names.TRAIN_KL: sum(kls) / len(kls),
            names.TRAIN_ENTROPY: sum(entropies) / len(entropies),
            names.TRAIN_GRAD_NORM: sum(norms) / len(norms) if norms else math.nan,
            names.TRAIN_LR: optimizer.param_groups[0]["lr"],
            names.TRAIN_SKIPPED_STEPS: float(skipped),
        }
    )
    return stats


def minibatch_rows(b: int, minibatches: int) -> list[torch.Tensor]:
    """Rows ``0..b-1`` shuffled and split into exactly ``minibatches`` shares.

    Share sizes differ by at most 1 (``torch.chunk`` would give fewer shares: 6 rows in 4 chunks
    of 2 make 3). The shuffle draws from torch's global generator.

    Raises:
        ValueError: fewer rows than shares (or no share).

    """
    if not 1 <= minibatches <= b:
        raise ValueError(
            f"engine.rl.minibatches={minibatches} cannot split a step's {b} rollouts into "
            f"non-empty minibatches; set engine.rl.minibatches to a number from 1 to {b}"
        )
    return list(torch.tensor_split(torch.randperm(b), minibatches))


def _select(batch: PackedBatch, rows: torch.Tensor) -> PackedBatch:
    return PackedBatch(
        batch.input_ids[rows],
        batch.attention_mask[rows],
        batch.response_mask[rows],
        batch.prompt_len,
    )


def grad_conflict(
    model: torch.nn.Module,
    batch: PackedBatch,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    adv: SegmentAdvantages,
    cfg: RLConfig,
    temperature: float,
) -> dict[str, float]:
    """cos(grad_tool, grad_summary) and both norms, the paper's appendix diagnostic.

    The policy-gradient loss (no KL term) restricted to each segment's tokens, a token-mean over
    that segment's tokens of the whole batch, one backward pass each, at the weights the update
    starts from. A segment with no token in the batch gets no pass, norm 0 and a NaN cosine; a
    segment whose gradient is zero (no token with an advantage) gives a cosine of 0, as
    ``torch.nn.functional.cosine_similarity`` does. The verl engine measures the same inside
    verl's actor (``slca_exp.engines.verl.grad_cos``).

    Returns:
        ``train/grad_cos``, ``train/grad_norm_tool``, ``train/grad_norm_summary``.

    """
    sums = [0.0, 0.0, 0.0]  # <g_tool, g_summary>, |g_tool|^2, |g_summary|^2
    tool: list[torch.Tensor | None] | None = None
    passes = 0
    for index, seg_mask in enumerate((adv.tool_mask, adv.summary_mask)):
        seg = seg_mask.to(advantages.device)
        if not bool(seg.any()):
            continue
        passes += 1
        model.zero_grad(set_to_none=True)
        logp, _ = response_logprobs(model, batch, temperature)
        pg_loss(
            logp,
            old_logp,
            advantages,
            seg,
            clip_ratio=cfg.clip_ratio,
            clip_ratio_c=cfg.clip_ratio_c,
        ).loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        sums[1 + index] = _dot(grads, grads)
        if index == 0:  # kept (one parameter at a time) while the summary's is computed
            tool = [None if g is None else g.detach().clone() for g in grads]
        elif tool is not None:
            sums[0] = _dot(tool, grads)
    model.zero_grad(set_to_none=True)
    norms = math.sqrt(sums[1]), math.sqrt(sums[2])
    cos = math.nan if passes < 2 else sums[0] / max(norms[0] * norms[1], _TINY)
    return {
        names.TRAIN_GRAD_COS: cos,
        names.TRAIN_GRAD_NORM_TOOL: norms[0],
        names.TRAIN_GRAD_NORM_SUMMARY: norms[1],
    }


_TINY = 1e-30
"""A zero gradient's cosine is 0 / _TINY = 0."""


def _dot(a: Sequence[torch.Tensor | None], b: Sequence[torch.Tensor | None]) -> float:
    """sum_i <a_i, b_i> over parameters, in float64 (a missing gradient counts as 0)."""
    parts = [
        torch.sum(x.double() * y.double())
        for x, y in zip(a, b, strict=True)
        if x is not None and y is not None
    ]
    return float(torch.stack(parts).sum()) if parts else 0.0


def segments(
    response_mask: torch.Tensor, ends_on_tool_call: Sequence[bool], rule: str
) -> SegmentSplit:
    """The tool and summary segments of a batch under ``engine.rl.mask_rule``.

    ``parity`` (the paper's rule): the last learnable run of each rollout is its summary, even
    when it is a tool call the turn or token budget cut off. ``corrected``: a rollout that ends
    on a tool call has no summary segment; all its learnable tokens are tool, and its summary
    score takes no part in its group's normalisation. The rule moves tokens between the
    segments only; the scores are the reward's either way.

    Args:
        response_mask: (B, T) 1 on learnable response tokens.
        ends_on_tool_call: (B,) per rollout, whether it ends on an unanswered tool call
            (``Rollouts.ends_on_tool_call``).
        rule: ``parity`` | ``corrected``.

    Raises:
        ValueError: an unknown rule, or not one flag per rollout.

    """
    split = split_segments(response_mask)
    if rule == "parity":
        return split
    if rule != "corrected":
        raise ValueError(
            f"engine.rl.mask_rule={rule!r} is not a mask rule; use parity or corrected"
        )
    return split.without_summary(torch.tensor(list(ends_on_tool_call), dtype=torch.bool))
