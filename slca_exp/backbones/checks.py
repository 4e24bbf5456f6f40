"""The ``backbone`` section's checks before a run (``slca_exp.preflight`` calls them)."""

from __future__ import annotations

from typing import Any

from slca_exp.core.problems import Problem


def config_problems(backbone: Any) -> list[Problem]:  # noqa: ANN401 - a backbone config
    """What validation refuses in a ``backbone`` config (the key, what is wrong, the fix).

    A hub or local backbone without its path; a builtin model without an architecture, or with
    one it cannot build.
    """
    from slca_exp.backbones.tiny import MIN_VOCAB

    if backbone.source in ("hf", "local") and not backbone.path:
        return [
            Problem(
                "backbone.path",
                f"backbone.source={backbone.source} needs the hub id or folder of the weights",
                "set backbone.path=<hub id or folder>",
            )
        ]
    if backbone.source != "builtin":
        return []
    arch = backbone.arch
    if arch is None:
        return [
            Problem(
                "backbone.arch",
                "backbone.source=builtin builds a model from scratch and needs its architecture",
                "set backbone.arch (see conf/backbone/tiny.yaml) or use backbone=tiny",
            )
        ]
    problems = []
    if arch.hidden_size % arch.num_heads or (arch.hidden_size // arch.num_heads) % 2:
        problems.append(
            Problem(
                "backbone.arch.num_heads",
                f"hidden_size={arch.hidden_size} / num_heads={arch.num_heads} is not an even "
                "whole head size (rotary embeddings rotate pairs of channels)",
                "pick num_heads so that hidden_size / num_heads is even, e.g. 64 / 4",
            )
        )
    if arch.vocab_size < MIN_VOCAB:
        problems.append(
            Problem(
                "backbone.arch.vocab_size",
                f"{arch.vocab_size} cannot hold the 3 special tokens, 256 byte symbols and 6 tags",
                f"set backbone.arch.vocab_size to at least {MIN_VOCAB} (tiny.yaml uses 1024)",
            )
        )
    return problems
