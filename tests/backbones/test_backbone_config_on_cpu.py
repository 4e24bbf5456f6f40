"""Backbone configs: the shipped choices, cross-field checks, what the recipe records."""

import re
import shutil

import pytest

from slca_exp.backbones.chat import TEMPLATE_SHA256
from slca_exp.preflight.compose import CONFIG_DIR, check_overrides, compose_run
from slca_exp.preflight.validate import ConfigError, validate
from slca_exp.recipe import build_recipe

from .conftest import REV

PAPER = {
    "qwen2.5-3b-instruct": "Qwen/Qwen2.5-3B-Instruct",
    "qwen2.5-7b-instruct": "Qwen/Qwen2.5-7B-Instruct",
    "qwen3-8b-base": "Qwen/Qwen3-8B-Base",
}


def problems(*overrides):
    return {p.key: p for p in check_overrides(list(overrides))[1]}


@pytest.mark.parametrize("choice", sorted(PAPER))
def test_paper_backbones_pin_a_revision(choice):
    b = validate(compose_run([f"backbone={choice}"])).backbone
    assert (b.name, b.source, b.path, b.dtype) == (choice, "hf", PAPER[choice], "bfloat16")
    assert re.fullmatch(r"[0-9a-f]{40}", b.revision) and b.arch is None
    text = (CONFIG_DIR / "backbone" / f"{choice}.yaml").read_text()
    assert f"huggingface-cli download {PAPER[choice]} --revision {b.revision}" in text


def test_tiny_is_small_enough_for_cpu_rl():
    arch = validate(compose_run([])).backbone.arch
    assert arch.num_layers * arch.hidden_size <= 256 and arch.max_position_embeddings == 1024


def test_arch_cross_checks_name_their_keys():
    found = problems("backbone.arch.num_heads=3", "backbone.arch.vocab_size=100")
    assert set(found) == {"backbone.arch.num_heads", "backbone.arch.vocab_size"}
    assert "265" in found["backbone.arch.vocab_size"].fix
    assert not problems("backbone.arch.hidden_size=96", "backbone.arch.num_heads=16")  # 6 each
    assert set(problems("backbone.arch.hidden_size=60", "backbone.arch.num_heads=4")) == {
        "backbone.arch.num_heads"  # 15 channels per head cannot be rotated in pairs
    }


def test_recipe_records_the_builtin_template_hash():
    recipe = build_recipe(validate(compose_run([])))
    assert recipe.backbone["chat_template"] == {"path": "builtin", "sha256": TEMPLATE_SHA256}


def test_hub_weights_must_be_here_for_the_local_engine(tmp_path, monkeypatch, checkpoint):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError) as err:
        build_recipe(validate(compose_run(["backbone=qwen2.5-7b-instruct"])))
    (problem,) = err.value.problems
    assert problem.key == "backbone.path" and "not in the local Hugging Face cache" in problem.what
    assert "huggingface-cli download Qwen/Qwen2.5-7B-Instruct --revision a09a3545" in problem.fix

    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / REV
    shutil.copytree(checkpoint, snapshot)
    overrides = ["backbone.source=hf", "backbone.path=org/tiny", f"backbone.revision={REV}"]
    recipe = build_recipe(validate(compose_run(overrides)))
    assert recipe.backbone["chat_template"] == {"path": "tokenizer", "sha256": TEMPLATE_SHA256}
    assert recipe.tags()["slca.backbone"] == f"hf:org/tiny@{REV[:12]}"
