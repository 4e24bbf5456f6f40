"""``backbone.source=builtin``: a tiny Qwen2-architecture causal LM built here, no download.

Its byte-level BPE tokenizer is trained with the ``tokenizers`` library on texts the engine passes
(rendered SFT trajectories and RL prompts), so the few hundred merges it learns are the ones the
task needs. The model is initialised from ``seed`` and saved as an ordinary HF checkpoint under
``cache_root/backbones/<key>``, where the key hashes everything that determines the bytes (the
architecture, the corpus, the seed, the chat template, this builder's version and the library
versions); the same inputs load the cached folder instead of building again. One process at a
time builds a key (under ``<folder>.lock``); a folder appears complete, by one rename, or not at
all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

from filelock import FileLock

from slca_exp.backbones.base import Backbone, BackboneError
from slca_exp.backbones.chat import (
    IM_END,
    PAD,
    SPECIAL_TOKENS,
    TEMPLATE,
    TEMPLATE_SHA256,
    TEXT_TOKENS,
)
from slca_exp.config.schema import TinyArchConfig

BUILD_VERSION = 1
"""Bump when this module changes what it builds: cached folders from older builds are ignored."""
MANIFEST = "slca_backbone.json"
"""Written last into a built folder (before it is moved into place): what went into its key."""
MIN_VOCAB = len(SPECIAL_TOKENS) + 256 + len(TEXT_TOKENS)
"""Special tokens, the 256 byte symbols and the tag tokens: the smallest vocabulary possible."""


def build_tiny(
    cfg: Any,  # noqa: ANN401 - BackboneConfig or its DictConfig
    *,
    corpus: Callable[[], Iterable[str]] | None,
    cache_root: Path,
    seed: int,
    device: str = "cpu",
) -> Backbone:
    """Build (or load from the cache) the tiny backbone of ``cfg.arch``; see the module doc.

    Raises:
        BackboneError: no architecture or no corpus to train the tokenizer on.

    """
    from slca_exp.backbones.hf import load_folder

    if cfg.arch is None:
        raise BackboneError(
            "backbone.arch: backbone.source=builtin needs an architecture; use backbone=tiny"
        )
    if corpus is None:
        raise BackboneError(
            "backbone.source=builtin trains its tokenizer on the data split, but no corpus was "
            "given to load_backbone (pass corpus=<callable returning the texts>)"
        )
    arch = {f.name: int(getattr(cfg.arch, f.name)) for f in fields(TinyArchConfig)}
    texts = list(corpus())
    inputs = {
        "arch": arch,
        "corpus_sha256": corpus_sha256(texts),
        "corpus_texts": len(texts),
        "seed": int(seed),
        "chat_template_sha256": TEMPLATE_SHA256,
        "code": _code_version(),
    }
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    folder = Path(cache_root) / "backbones" / key[:16]
    if not (folder / MANIFEST).is_file():
        # Jobs started together need the same folder: one builds it, the others wait and load it.
        with FileLock(f"{folder}.lock"):
            if not (folder / MANIFEST).is_file():
                _build_into(folder, texts, arch, int(seed), inputs)
    return load_folder(
        folder, name=cfg.name, dtype=cfg.dtype, device=device, chat_template=cfg.chat_template
    )


def corpus_sha256(texts: Iterable[str]) -> str:
    """sha256 of the texts, each length-prefixed (so ``["ab"]`` and ``["a", "b"]`` differ)."""
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def train_tokenizer(texts: Iterable[str], vocab_size: int, max_length: int) -> Any:  # noqa: ANN401
    """A byte-level BPE ``PreTrainedTokenizerFast`` of at most ``vocab_size`` tokens.

    Ids 0-2 are ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos), all special; the
    tag tokens (``<tool_call>``, ``</tool_response>``, ``<think>``, ...) come last and are not
    special, so decoding with ``skip_special_tokens=True`` keeps them. Training texts are cut
    at the tags, as tokenizing cuts them, so merges are spent on the text between tags.

    Raises:
        BackboneError: ``vocab_size`` below :data:`MIN_VOCAB`.

    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < MIN_VOCAB:
        raise BackboneError(
            f"backbone.arch.vocab_size={vocab_size} is below {MIN_VOCAB} (special tokens, 256 "
            f"bytes and the tag tokens); set it to at least {MIN_VOCAB}"
        )
    tags = (*SPECIAL_TOKENS, *TEXT_TOKENS)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TEXT_TOKENS),
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    split = re.compile("|".join(re.escape(tag) for tag in tags))
    pieces = (piece for text in texts for piece in split.split(text) if piece)
    tok.train_from_iterator(pieces, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TEXT_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        model_max_length=max_length,
        chat_template=TEMPLATE,
    )


def build_model(arch: dict[str, int], tokenizer: Any, seed: int) -> Any:  # noqa: ANN401
    """A ``Qwen2ForCausalLM`` of ``arch`` over the tokenizer's vocabulary, seeded by ``seed``.

    The global torch RNG is forked, so building does not move the caller's random stream.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=arch["hidden_size"],
        intermediate_size=arch["intermediate_size"],
        num_hidden_layers=arch["num_layers"],
        num_attention_heads=arch["num_heads"],
        num_key_value_heads=arch["num_heads"],
        max_position_embeddings=arch["max_position_embeddings"],
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def _build_into(
    folder: Path, texts: list[str], arch: dict[str, int], seed: int, inputs: dict[str, Any]
) -> None:
    """Train, build and save into a private folder, then move it into place (atomic rename).

    The caller holds the key's lock; should a folder appear anyway (a process that did not lock),
    the rename fails, this copy is dropped and the other one's is used.
    """
    # Imported before the clock starts, so that the recorded timings measure the work.
    from tokenizers import trainers  # noqa: F401
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM  # noqa: F401

    from slca_exp.backbones.hf import quiet_progress

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        t0 = time.perf_counter()
        tokenizer = train_tokenizer(
            texts, arch["vocab_size"], max_length=arch["max_position_embeddings"]
        )
        t1 = time.perf_counter()
        model = build_model(arch, tokenizer, seed)
        t2 = time.perf_counter()
        with quiet_progress():
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        manifest = {
            **inputs,
            "vocab_size": len(tokenizer),
            "seconds": {"tokenizer": round(t1 - t0, 3), "model": round(t2 - t1, 3)},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        try:
            tmp.rename(folder)
        except OSError:
            if not (folder / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _code_version() -> dict[str, Any]:
    from importlib import metadata

    versions = {name: metadata.version(name) for name in ("tokenizers", "transformers", "torch")}
    return {"build": BUILD_VERSION, **versions}
