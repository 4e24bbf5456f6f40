"""Token log-probabilities and the clipped policy-gradient loss of the local engine.

Shapes: B samples, P prompt columns (left-padded), T response columns (right-padded); every
response starts at column P (``rollout.PackedBatch``).

The loss is PPO's clipped surrogate with token-mean aggregation over the learnable response
tokens of the whole (mini)batch, as verl's default ``loss_agg_mode=token-mean``:

    ratio = exp(logp - logp_old)
    L_pg  = mean_tokens( max(-A * ratio, -A * clip(ratio, 1 - c, 1 + c)) )
    L     = L_pg + kl_coef * mean_tokens( k3(logp, logp_ref) )

with k3 the low-variance KL estimator exp(ref - logp) - (ref - logp) - 1 (verl's ``low_var_kl``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from slca_exp.engines.local.rollout import PackedBatch


def response_logprobs(
    model: torch.nn.Module, batch: PackedBatch, temperature: float = 1.0, *, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the response tokens under ``model``.

    Args:
        model: a causal LM returning ``.logits`` (B, L, V).
        batch: the packed samples.
        temperature: logits are divided by it (the sampling distribution's log-probs).
        entropy: also return the per-token entropy.

    Returns:
        (B, T) float32 log-probs, and (B, T) entropies or ``None``.

    """
    attn = batch.attention_mask
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=batch.input_ids, attention_mask=attn, position_ids=positions).logits
    p = batch.prompt_len
    logits = logits[:, p - 1 : -1].float() / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    ent = None
    if entropy:
        ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent


@dataclass(frozen=True)
class LossParts:
    """The loss and what is logged about it (scalars, detached)."""

    loss: torch.Tensor
    pg: float
    kl: float
    clip_frac: float


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over ``mask`` (token-mean; 0 when the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def pg_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio: float,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> LossParts:
    """The clipped surrogate plus the optional KL term, token-mean over ``mask``.

    Args:
        logp: (B, T) current log-probs (with grad).
        old_logp: (B, T) log-probs of the policy that sampled the tokens.
        advantages: (B, T) token advantages (0 off the learnable tokens).
        mask: (B, T) learnable tokens.
        clip_ratio: c.
        ref_logp: (B, T) reference log-probs, for the KL term.
        kl_coef: weight of the KL term.

    """
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio)
    pg = masked_mean(torch.maximum(unclipped, clipped), mask)
    loss = pg
    kl_value = 0.0
    if ref_logp is not None and kl_coef > 0:
        delta = (ref_logp - logp).clamp(-20.0, 20.0)
        kl = masked_mean(delta.exp() - delta - 1.0, mask)
        loss = loss + kl_coef * kl
        kl_value = float(kl.detach())
    with torch.no_grad():
        clip_frac = float(masked_mean((clipped > unclipped).float(), mask))
    return LossParts(loss, float(pg.detach()), kl_value, clip_frac)


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter gradient, flattened into one vector (zeros where there is none)."""
    parts = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
        for p in model.parameters()
        if p.requires_grad
    ]
    return torch.cat(parts)
