"""Pretrained backbones from a folder or the local HF cache, never downloaded."""

import shutil

import pytest
import torch

from slca_exp.backbones import TEMPLATE, BackboneError, load_backbone
from slca_exp.backbones.chat import template_sha256
from slca_exp.backbones.hf import folder_template_sha256, resolve_local
from slca_exp.config.schema import BackboneConfig

from .conftest import REV


@pytest.fixture
def hub(checkpoint, tmp_path, monkeypatch):
    """An HF hub cache holding org/tiny at REV, laid out as `huggingface-cli download` does."""
    repo = tmp_path / "hub" / "models--org--tiny"
    shutil.copytree(checkpoint, repo / "snapshots" / REV)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return repo / "snapshots" / REV


def load(**cfg):
    return load_backbone(BackboneConfig(**cfg), corpus=None, cache_root=None, seed=0)


def test_a_local_folder_loads_with_its_dtype(checkpoint):
    backbone = load(name="mine", source="local", path=str(checkpoint), dtype="bfloat16")
    assert backbone.path == checkpoint and backbone.name == "mine"
    assert backbone.model.dtype == torch.bfloat16 and not backbone.model.training
    assert backbone.chat_template_sha256 == template_sha256(TEMPLATE)
    assert folder_template_sha256(checkpoint) == backbone.chat_template_sha256


def test_a_hub_id_resolves_in_the_local_cache_at_its_revision(hub):
    backbone = load(source="hf", path="org/tiny", revision=REV)
    assert backbone.path == hub
    assert load(source="hf", path="org/tiny").path == hub  # refs/main
    assert resolve_local("org/tiny", "f" * 40) is None


def test_missing_weights_name_the_key_and_the_download_command(hub):
    with pytest.raises(BackboneError) as err:
        load(source="hf", path="Qwen/Qwen2.5-7B-Instruct", revision=REV)
    message = str(err.value)
    assert message.startswith("backbone.path: Qwen/Qwen2.5-7B-Instruct at revision")
    assert f"huggingface-cli download Qwen/Qwen2.5-7B-Instruct --revision {REV}" in message
    assert str(hub.parents[2]) in message  # the cache that was searched
    with pytest.raises(BackboneError, match="backbone.path: '/nowhere/model' is not a folder"):
        load(source="local", path="/nowhere/model")


def test_an_incomplete_snapshot_is_reported_not_crashed(hub):
    (hub / "model.safetensors").unlink()
    with pytest.raises(BackboneError, match="backbone.path: cannot load the checkpoint"):
        load(source="hf", path="org/tiny", revision=REV)


def test_a_chat_template_file_replaces_the_tokenizers(checkpoint, tmp_path):
    ours = tmp_path / "hermes.jinja"
    ours.write_text(TEMPLATE.replace("Call:", "Use:"))
    backbone = load(source="local", path=str(checkpoint), chat_template=str(ours))
    assert "Use:" in backbone.tokenizer.chat_template
    assert backbone.chat_template_sha256 == template_sha256(ours.read_text())

    misfit = tmp_path / "toolrole.jinja"
    misfit.write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(BackboneError, match="backbone.chat_template: .* does not fit"):
        load(source="local", path=str(checkpoint), chat_template=str(misfit))
