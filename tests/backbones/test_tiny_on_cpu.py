"""The builtin tiny backbone: tokenizer, seeded model, cached checkpoint."""

import json

import pytest
import torch

from slca_exp.backbones import TEMPLATE_SHA256, BackboneError, load_backbone
from slca_exp.backbones import tiny as tiny_module
from slca_exp.backbones.chat import TEXT_TOKENS, render_prompt
from slca_exp.backbones.tiny import MIN_VOCAB, train_tokenizer
from slca_exp.config.schema import BackboneConfig, TinyArchConfig

from .conftest import TOOLS, trajectory

ARCH = TinyArchConfig(
    num_layers=2,
    hidden_size=32,
    num_heads=4,
    intermediate_size=64,
    vocab_size=400,
    max_position_embeddings=512,
)


def config(**changes):
    return BackboneConfig(name="tiny", source="builtin", arch=ARCH, **changes)


def load(corpus, root, seed=0, **changes):
    return load_backbone(config(**changes), corpus=lambda: corpus, cache_root=root, seed=seed)


def test_tokenizer_tokens(tokenizer):
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
    ]
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.eos_token == "<|im_end|>"
    assert len(tokenizer) <= 400
    for tag in TEXT_TOKENS:
        (one,) = tokenizer(tag, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode([one], skip_special_tokens=True) == tag
    text = "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert (
        tokenizer.decode(ids, skip_special_tokens=True)
        == "assistant\n<tool_call>\n{}\n</tool_call>"
    )
    # Byte-level: text never seen in training still round-trips.
    assert tokenizer.decode(tokenizer("Zürich ☂ 42")["input_ids"]) == "Zürich ☂ 42"


def test_vocab_below_the_minimum_is_refused(corpus):
    with pytest.raises(BackboneError, match="backbone.arch.vocab_size"):
        train_tokenizer(corpus, MIN_VOCAB - 1, max_length=64)
    assert len(train_tokenizer(corpus, MIN_VOCAB, max_length=64)) == MIN_VOCAB


def test_builds_a_qwen2_checkpoint_then_loads_it_from_the_cache(corpus, tmp_path, monkeypatch):
    rng = torch.get_rng_state()
    first = load(corpus, tmp_path)
    assert torch.equal(torch.get_rng_state(), rng)  # building does not move the caller's RNG
    model, cfg = first.model, first.model.config
    assert type(model).__name__ == "Qwen2ForCausalLM" and not model.training
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (2, 32, 4)
    assert (cfg.intermediate_size, cfg.max_position_embeddings) == (64, 512)
    assert cfg.vocab_size == len(first.tokenizer) <= 400 and cfg.tie_word_embeddings
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert first.path.parent == tmp_path / "backbones" and len(first.path.name) == 16
    for name in ("config.json", "model.safetensors", "tokenizer.json", "slca_backbone.json"):
        assert (first.path / name).is_file()
    assert first.chat_template_sha256 == TEMPLATE_SHA256
    assert first.stop_token_ids == (first.tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    manifest = json.loads((first.path / "slca_backbone.json").read_text())
    assert manifest["seed"] == 0 and manifest["arch"]["hidden_size"] == 32

    def no_training(*args, **kwargs):
        raise AssertionError("the cached checkpoint should have been loaded")

    monkeypatch.setattr(tiny_module, "train_tokenizer", no_training)
    monkeypatch.setattr(tiny_module, "build_model", no_training)
    again = load(corpus, tmp_path)
    assert again.path == first.path
    assert _same_weights(first.model, again.model)
    assert again.tokenizer.chat_template == first.tokenizer.chat_template


def test_same_inputs_same_weights_other_inputs_other_folder(corpus, tmp_path):
    a = load(corpus, tmp_path / "a")
    b = load(corpus, tmp_path / "b")
    assert a.path.name == b.path.name and _same_weights(a.model, b.model)
    other_seed = load(corpus, tmp_path / "a", seed=1)
    assert other_seed.path != a.path and not _same_weights(a.model, other_seed.model)
    other_corpus = load(corpus[:-1], tmp_path / "a")
    assert other_corpus.path not in (a.path, other_seed.path)


def test_dtype_and_generation(corpus, tmp_path):
    backbone = load(corpus, tmp_path, dtype="bfloat16")
    assert backbone.model.dtype == torch.bfloat16
    tok = backbone.tokenizer
    prompt = render_prompt(tok, trajectory()[:2], TOOLS)
    ids = torch.tensor([tok(prompt)["input_ids"]])
    with torch.no_grad():
        out = backbone.model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > ids.shape[1]


def test_builtin_needs_a_corpus_and_an_arch(tmp_path):
    with pytest.raises(BackboneError, match="corpus"):
        load_backbone(config(), corpus=None, cache_root=tmp_path, seed=0)
    with pytest.raises(BackboneError, match="backbone.arch"):
        load_backbone(BackboneConfig(), corpus=lambda: ["x"], cache_root=tmp_path, seed=0)
    assert not (tmp_path / "backbones").exists()


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
