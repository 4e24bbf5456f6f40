"""``backbone.source=hf|local``: pretrained weights already on this machine, never downloaded.

A hub id is resolved in the local Hugging Face cache only (``$HF_HUB_CACHE``, else
``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``) at the pinned ``backbone.revision``; a folder
is used as it is. Missing weights raise :class:`BackboneError` with the download command.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from slca_exp.backbones.base import Backbone, BackboneError
from slca_exp.backbones.chat import IM_END, check_template, template_sha256


def load_pretrained(cfg: Any, *, device: str = "cpu") -> Backbone:  # noqa: ANN401
    """Load ``cfg.path`` (hub id or folder) with ``cfg.dtype`` and ``cfg.chat_template``.

    Raises:
        BackboneError: the weights are not on this machine, cannot be loaded, or their chat
            template does not render tool turns in the layout the local engine writes.

    """
    if not cfg.path:
        raise BackboneError(
            f"backbone.path: backbone.source={cfg.source} needs a hub id or a folder; "
            "set backbone.path=<org/name or folder>"
        )
    folder = resolve_local(cfg.path, cfg.revision)
    if folder is None:
        raise BackboneError(missing_message(cfg.source, cfg.path, cfg.revision))
    return load_folder(
        folder, name=cfg.name, dtype=cfg.dtype, device=device, chat_template=cfg.chat_template
    )


def resolve_local(path: str, revision: str | None) -> Path | None:
    """The folder holding ``path``: itself when it is a folder, else its snapshot in the HF cache.

    Returns None when neither exists here. Nothing is downloaded.
    """
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder
    if "/" not in path or path.startswith(("/", ".", "~")):
        return None
    from huggingface_hub import snapshot_download

    try:
        snapshot = snapshot_download(
            path, revision=revision, cache_dir=hub_cache(), local_files_only=True
        )
    except (OSError, ValueError):  # LocalEntryNotFoundError and invalid ids / revisions
        return None
    return Path(snapshot) if (Path(snapshot) / "config.json").is_file() else None


def hub_cache() -> str:
    """The HF hub cache folder, read from the environment at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface"
    )
    return os.path.expanduser(os.path.join(home, "hub"))


def missing(source: str, path: str, revision: str | None) -> tuple[str, str]:
    """What is wrong and the fix, for weights that are not on this machine."""
    if source == "local" or path.startswith(("/", ".", "~")):
        return f"{path!r} is not a folder", "point backbone.path at the checkpoint folder"
    rev = f" --revision {revision}" if revision else ""
    at = f" at revision {revision}" if revision else ""
    what = (
        f"{path}{at} is not in the local Hugging Face cache ({hub_cache()}) and nothing is "
        "downloaded at run time"
    )
    fix = (
        f"fetch it first with `huggingface-cli download {path}{rev}` (or `hf download "
        f"{path}{rev}`), or set backbone.path to a local checkpoint folder"
    )
    return what, fix


def missing_message(source: str, path: str, revision: str | None) -> str:
    """:func:`missing` as one message naming ``backbone.path``."""
    what, fix = missing(source, path, revision)
    return f"backbone.path: {what}; {fix}"


def folder_template_sha256(folder: Path) -> str | None:
    """sha256 of the chat template saved in a checkpoint folder, or None when it has none.

    Reads ``chat_template.jinja`` (transformers >= 4.43 writes it) or ``tokenizer_config.json``'s
    ``chat_template``, the same text the tokenizer loads.
    """
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return template_sha256(jinja.read_bytes().decode("utf-8"))
    config = folder / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        if template:
            return template_sha256(template)
    return None


def load_folder(
    folder: Path,
    *,
    name: str,
    dtype: str,
    device: str = "cpu",
    chat_template: str | None = None,
) -> Backbone:
    """Load a saved checkpoint folder (model in eval mode on ``device``, tokenizer, template).

    Args:
        folder: holds ``config.json``, weights and the tokenizer files.
        name: ``backbone.name``.
        dtype: ``float32`` | ``bfloat16`` | ``float16``.
        device: torch device string.
        chat_template: a jinja file replacing the tokenizer's template, or None.

    Raises:
        BackboneError: unreadable checkpoint, no usable chat template.

    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with quiet_progress():
            tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                folder, dtype=getattr(torch, dtype), local_files_only=True
            )
    except (OSError, ValueError) as exc:
        raise BackboneError(
            f"backbone.path: cannot load the checkpoint in {folder} ({exc}); re-download it or "
            "point backbone.path at a complete folder (config.json, weights, tokenizer files)"
        ) from exc
    if chat_template:
        tokenizer.chat_template = Path(chat_template).read_bytes().decode("utf-8")
    if not tokenizer.chat_template:
        raise BackboneError(
            f"backbone.chat_template: the tokenizer in {folder} has no chat template; set "
            "backbone.chat_template to a jinja file in the hermes / ChatML layout"
        )
    misfit = check_template(tokenizer)
    if misfit:
        raise BackboneError(
            f"backbone.chat_template: the chat template of {folder} does not fit the local "
            f"engine's hermes / ChatML rollouts ({misfit}); set backbone.chat_template to a "
            "template in that layout (slca_exp.backbones.chat.TEMPLATE is one)"
        )
    model.to(device)
    model.eval()
    return Backbone(
        model=model,
        tokenizer=tokenizer,
        path=Path(folder),
        chat_template_sha256=template_sha256(tokenizer.chat_template),
        name=name,
        stop_token_ids=stop_token_ids_of(tokenizer, getattr(model, "generation_config", None)),
    )


def stop_token_ids_of(
    tokenizer: Any,  # noqa: ANN401
    generation_config: Any = None,  # noqa: ANN401
) -> tuple[int, ...]:
    """The tokens that end an assistant turn, in this order, without repeats.

    ``<|im_end|>`` (the chat layout's end of turn), the tokenizer's eos token, and the eos
    token(s) the checkpoint's ``generation_config`` declares (Qwen2.5-Instruct lists
    ``<|endoftext|>`` there too). Only the stop tokens are read from a checkpoint's
    generation config: how tokens are sampled is the recipe's
    (``slca_exp.engines.local.sampling.generation_config``).
    """
    declared = getattr(generation_config, "eos_token_id", None)
    if not isinstance(declared, list | tuple):
        declared = [declared]
    im_end = tokenizer.get_vocab().get(IM_END)  # not convert_tokens_to_ids: that gives unk
    stops = [im_end, tokenizer.eos_token_id, *declared]
    return tuple(dict.fromkeys(i for i in stops if isinstance(i, int) and i >= 0))


@contextmanager
def quiet_progress() -> Iterator[None]:
    """No transformers progress bars inside (loading a tiny model is not worth a bar)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
