"""A backbone's stop tokens: the chat layout's end of turn, the eos token, the declared ones."""

import json
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import GenerationConfig

from slca_exp.backbones import load_backbone
from slca_exp.backbones.hf import stop_token_ids_of
from slca_exp.config.schema import BackboneConfig


def load(folder):
    cfg = BackboneConfig(name="t", source="local", path=str(folder))
    return load_backbone(cfg, corpus=None, cache_root=None, seed=0)


def test_a_checkpoints_declared_eos_tokens_are_stop_tokens(checkpoint, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    config = folder / "generation_config.json"
    im_end = load(folder).tokenizer.convert_tokens_to_ids("<|im_end|>")
    # Qwen2.5-Instruct's layout: eos_token_id lists <|im_end|> and <|endoftext|>
    config.write_text(json.dumps({**json.loads(config.read_text()), "eos_token_id": [im_end, 0]}))
    backbone = load(folder)
    assert backbone.stop_token_ids == (im_end, 0)
    config.write_text(json.dumps({**json.loads(config.read_text()), "eos_token_id": 7}))
    assert load(folder).stop_token_ids == (im_end, 7)


@given(declared=st.one_of(st.none(), st.integers(-1, 400), st.lists(st.integers(-1, 400))))
def test_stop_tokens_start_with_the_end_of_turn_and_never_repeat(tokenizer, declared):
    stops = stop_token_ids_of(tokenizer, GenerationConfig(eos_token_id=declared))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert stops[0] == im_end and len(set(stops)) == len(stops)
    wanted = declared if isinstance(declared, list) else [declared]
    assert set(stops) == {im_end, tokenizer.eos_token_id} | {
        i for i in wanted if i is not None and i >= 0
    }


def test_without_a_generation_config_the_tokenizer_decides(tokenizer):
    assert stop_token_ids_of(tokenizer) == (tokenizer.convert_tokens_to_ids("<|im_end|>"),)


@pytest.mark.parametrize("declared", [[], None])
def test_an_empty_declaration_adds_nothing(tokenizer, declared):
    assert stop_token_ids_of(tokenizer, GenerationConfig(eos_token_id=declared)) == (
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
