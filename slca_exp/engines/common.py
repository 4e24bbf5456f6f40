"""What both engines take from the data and backbone packages: the corpus and the backbone.

    split rows -> corpus(splits)           every row rendered with the chat template (a row is
                                           read through ``slca_exp.core.rows.Row``)
    RunConfig + splits
      -> run_backbone(config, splits)      ``backbone.*``; a built-in one is trained on the
                                           corpus and cached under ``<tracking.root>/cache``

The local engine loads the backbone to train it; the verl engine saves the built-in one as an
ordinary HF checkpoint that verl loads (the same inputs reuse the cached folder).
"""

from __future__ import annotations

from slca_exp.backbones import Backbone, load_backbone
from slca_exp.backbones.chat import render_text
from slca_exp.config.paths import output_root
from slca_exp.config.schema import RunConfig
from slca_exp.core.rows import Row
from slca_exp.data.splits import Split


def corpus(splits: dict[str, Split]) -> list[str]:
    """Texts a built-in tokenizer is trained on: every row rendered with the chat template."""
    texts = []
    for split in splits.values():
        for row in map(Row, split.rows):
            tools, messages = row.tools(), row.messages()
            if messages is not None:
                texts.append(render_text(messages, tools))
            texts.append(render_text(row.prompt(), tools))
    return texts


def run_backbone(config: RunConfig, splits: dict[str, Split], device: str = "cpu") -> Backbone:
    """The run's policy and tokenizer (a built-in one is trained on the splits and cached)."""
    return load_backbone(
        config.backbone,
        corpus=lambda: corpus(splits),
        cache_root=output_root(config.tracking) / "cache",
        seed=config.seed,
        device=device,
    )
