"""Token log-probabilities and the clipped policy-gradient loss of the local engine.

Shapes: B samples, P prompt columns (left-padded), T response columns (right-padded); every
response starts at column P (``rollout.PackedBatch``).

The loss is verl 0.9's actor loss at its defaults, computed here so the local engine needs no
verl: ``compute_policy_loss_vanilla`` (dual-clip PPO) with ``loss_agg_mode=token-mean``, plus
``kl_loss_coef`` times the ``low_var_kl`` penalty (``use_kl_loss``), each a token-mean over the
learnable response tokens of the whole (mini)batch:

    r     = exp(clamp(logp - logp_old, -20, 20))
    l     = max(-A * r, -A * clip(r, 1 - c, 1 + c))            PPO's clipped surrogate
    l     = min(l, -A * c_dual)   where A < 0                   dual clip (c_dual = 3)
    d     = clamp(logp_ref - logp, -20, 20)
    k3    = clamp(exp(d) - d - 1, -10, 10)                      low-variance KL estimator
    L     = mean_tokens(l) + kl_coef * mean_tokens(k3)

The clamps are verl's safeguards: the log-ratio bound keeps ``r`` finite after large updates
(several epochs or minibatches move the policy away from the sampler), the dual clip bounds the
loss of a negative-advantage token whose ratio exploded (Ye et al. 2020, arXiv:1912.09729), and
the KL bound caps a token far from the reference. Where a clamp or clip decides a token's value
its gradient is 0, as in verl. The test suite pins the value and gradient to verl's own functions.
One difference: an empty mask gives 0 (verl divides by a zero token count).
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


LOG_RATIO_BOUND = 20.0
"""``|logp - logp_old|`` and ``|logp_ref - logp|`` are clamped to this before ``exp`` (verl)."""
KL_BOUND = 10.0
"""The per-token low-variance KL is clamped to ``[-KL_BOUND, KL_BOUND]`` (verl)."""


@dataclass(frozen=True)
class LossParts:
    """The loss and what is logged about it (scalars, detached)."""

    loss: torch.Tensor
    pg: float
    kl: float
    clip_frac: float


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over ``mask`` (token-mean; 0 when the mask is empty).

    Values off the mask never reach the result, not even a NaN or an infinity there.
    """
    mask = mask.to(values.dtype)
    kept = torch.where(mask.bool(), values, torch.zeros_like(values))
    return (kept * mask).sum() / mask.sum().clamp(min=1.0)


def low_var_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference), clamped as verl's ``low_var_kl``."""
    delta = (ref_logp - logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return (delta.exp() - delta - 1.0).clamp(-KL_BOUND, KL_BOUND)


def pg_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio: float,
    clip_ratio_c: float = 3.0,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> LossParts:
    """The dual-clip surrogate plus the optional KL term, token-mean over ``mask``.

    Equal, value and gradient, to verl 0.9's ``compute_policy_loss_vanilla`` (``clip_ratio_low =
    clip_ratio_high = clip_ratio``) aggregated with ``agg_loss(..., "token-mean")``, plus
    ``kl_coef * agg_loss(kl_penalty(logp, ref_logp, "low_var_kl"), ...)``: see the module doc.

    Args:
        logp: (B, T) current log-probs (with grad).
        old_logp: (B, T) log-probs of the policy that sampled the tokens.
        advantages: (B, T) token advantages (0 off the learnable tokens).
        mask: (B, T) learnable tokens.
        clip_ratio: c, the PPO clip range of the ratio.
        clip_ratio_c: the dual-clip bound (> 1): a token with A < 0 loses at most -A * this.
        ref_logp: (B, T) reference log-probs, for the KL term.
        kl_coef: weight of the KL term.

    Returns:
        The loss; ``pg`` the surrogate alone, ``kl`` the mean KL (0 without a KL term) and
        ``clip_frac`` the share of tokens where the PPO clip decides the value.

    Raises:
        ValueError: ``clip_ratio_c`` is not above 1.

    """
    if not clip_ratio_c > 1.0:
        raise ValueError(
            f"the dual-clip bound must be > 1 (got {clip_ratio_c}); "
            "set engine.rl.clip_ratio_c above 1 (verl's default: 3.0)"
        )
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio)
    surrogate = torch.maximum(unclipped, clipped)
    dual = torch.minimum(surrogate, -advantages * clip_ratio_c)
    pg = masked_mean(torch.where(advantages < 0, dual, surrogate), mask)
    loss = pg
    kl_value = 0.0
    if ref_logp is not None and kl_coef > 0:
        kl = masked_mean(low_var_kl(logp, ref_logp), mask)
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
