"""What loading a backbone returns, and the one error it raises.

Kept free of torch and transformers imports so that validation and the recipe can use it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class BackboneError(ValueError):
    """A backbone cannot be built or loaded; the message names the config key and the fix.

    A ``ValueError`` so that callers treating bad configuration as exit code 2 catch it.
    """


@dataclass
class Backbone:
    """A policy model ready for the local engine.

    Attributes:
        model: a ``transformers.PreTrainedModel`` causal LM, in eval mode, on the requested device.
        tokenizer: its ``PreTrainedTokenizerFast``, carrying the chat template in use.
        path: the folder of the saved HF checkpoint (config, weights, tokenizer, template).
        chat_template_sha256: sha256 (hex) of the chat template text the tokenizer renders with.
        name: ``backbone.name``.
        stop_token_ids: ids that end an assistant turn (``<|im_end|>``, the eos token and the
            checkpoint's declared eos tokens); the local engine's rollouts stop on any of them.

    """

    model: Any
    tokenizer: Any
    path: Path
    chat_template_sha256: str
    name: str
    stop_token_ids: tuple[int, ...] = field(default=())
