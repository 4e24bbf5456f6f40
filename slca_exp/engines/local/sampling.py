"""One generation configuration decides sampling and scoring in the local engine.

The rollout samples each assistant turn with a configuration built fresh from the recipe
(``engine.rollout.temperature``, no top-k or top-p truncation, the backbone's stop tokens);
nothing of a checkpoint's own ``generation_config.json`` reaches the sampler. Tokens are then
drawn from softmax(logits / temperature) over the whole vocabulary, the distribution
``policy.response_logprobs`` scores them under and the clipped update takes as the sampling
policy. A checkpoint's leftovers would make the two differ: Qwen2.5-Instruct's configuration
sets a repetition penalty of 1.05, top-k 20 and top-p 0.8, which shape what is sampled but not
the log-probs the update uses.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


def generation_config(
    *,
    temperature: float,
    greedy: bool,
    max_new_tokens: int,
    stop_ids: Sequence[int],
    pad_id: int,
    scores: bool = False,
) -> Any:  # noqa: ANN401 - a transformers GenerationConfig
    """The generation configuration of one assistant turn, built from the recipe alone.

    Sampling draws from softmax(logits / temperature) over the whole vocabulary (top-k 0,
    top-p 1), the distribution the update scores the tokens under; greedy decoding takes the
    argmax. A turn ends at any of ``stop_ids``. Every other setting keeps transformers'
    neutral default, provided the model's own ``generation_config`` is out of the way while
    generating (:func:`generating_with`).

    Args:
        temperature: ``engine.rollout.temperature`` (the scorer divides the logits by it too).
        greedy: argmax decoding (validation) instead of sampling.
        max_new_tokens: tokens this turn may generate.
        stop_ids: the backbone's stop tokens (``Backbone.stop_token_ids``).
        pad_id: written after a finished sequence.
        scores: ``generate`` also returns each step's processed logits (``.scores``), the
            distribution every token was drawn from.

    """
    from transformers import GenerationConfig

    extra: dict[str, Any] = {"do_sample": False}
    if not greedy:
        extra = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    if scores:
        extra.update(output_scores=True, return_dict_in_generate=True)
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        eos_token_id=list(stop_ids),
        pad_token_id=pad_id,
        **extra,
    )


@contextmanager
def generating_with(model: Any, config: Any) -> Iterator[None]:  # noqa: ANN401
    """Inside, ``model.generation_config`` is ``config``.

    ``generate`` fills every setting its ``generation_config`` argument leaves unset from the
    model's own (a checkpoint's ``generation_config.json``: Qwen2.5-Instruct's sets a
    repetition penalty of 1.05, top-k 20, top-p 0.8), so passing a config is not enough to keep
    them out: the model's must be the same fresh config while it generates.
    """
    saved = model.generation_config
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = saved
