"""What the RL and the SFT translations share: the steps, and the values both configs carry.

    translated(config, name, values, overrides, where)
      -> verl's config ``name`` composed (``compose.py``), copied
      -> our values set, one verl key each (a key verl does not have is a bug of our tables)
      -> the user's raw overrides applied last (``overrides.py``)
      == DictConfig, or ConfigError naming every bad override

The values both translations take from the run: the backend (:func:`backend_of`), the weights
verl loads (:func:`model_path`, the built-in backbone built and saved on first use), the chat
template, the trackers' run name, the run's verl folder and the Ray workers' environment
(:func:`worker_env`: our plugin, the cpu platform, where the trackers write).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from slca_exp.config.paths import output_root, run_dir, run_key
from slca_exp.config.schema import RunConfig
from slca_exp.core.problems import ConfigError, Problem
from slca_exp.engines.verl import cpu
from slca_exp.engines.verl.compose import compose_verl, has_key, verl_config_dir
from slca_exp.engines.verl.keys import MODULES_ENV, PLUGIN_MODULE, ROLLOUT_LOG
from slca_exp.engines.verl.overrides import apply_overrides
from slca_exp.recipe import Recipe


def translated(
    config: RunConfig,
    name: str,
    values: dict[str, Any],
    overrides: list[str],
    where: str,
    *,
    new_keys: tuple[str, ...] = (),
) -> DictConfig:
    """Verl's config ``name`` composed, with ``values`` set, then ``overrides`` applied.

    Args:
        config: the run config (its backbone must be a checkpoint verl can load).
        name: verl's config (``ppo_trainer``, ``sft_trainer_engine``).
        values: verl key -> our value; each key must be verl's, except ``new_keys``.
        overrides: raw verl overrides (Hydra syntax), applied last.
        where: the key of ours that holds ``overrides`` (problems name ``where[i]``).
        new_keys: keys of ours added to verl's config.

    Raises:
        ConfigError: verl is not installed, the backbone is builtin, or overrides are bad.

    """
    if config.backbone.source != "builtin" and not config.backbone.path:
        raise ConfigError(
            [
                Problem(
                    "backbone.path",
                    "engine=verl loads a Hugging Face checkpoint and the backbone names none",
                    "pick a hub or local backbone, e.g. backbone=qwen2.5-7b-instruct, or the "
                    "built-in backbone=tiny",
                )
            ]
        )
    cfg = copy.deepcopy(compose_verl(str(verl_config_dir()), name))
    with open_dict(cfg):
        for key, value in values.items():
            new = key in new_keys
            if not (new or has_key(cfg, key)):  # our own table must use verl's names exactly
                raise KeyError(f"{key!r} is not a key of verl's {name} config")
            OmegaConf.update(cfg, key, value, merge=False, force_add=new)
    problems = apply_overrides(cfg, overrides, where)
    if problems:
        raise ConfigError(problems)
    return cfg


def backend_of(config: RunConfig) -> str:
    """``engine.verl.backend`` resolved: ``auto`` is ``cuda`` when this host has a GPU."""
    backend = config.engine.verl.backend
    if backend != "auto":
        return backend
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def model_path(config: RunConfig, recipe: Recipe | None = None) -> str:
    """The checkpoint verl loads: ``backbone.path``, or the built-in backbone's cached folder.

    The built-in (``backbone=tiny``) is built as the local engine builds it, from the run's
    splits (its tokenizer is trained on them), and saved as an ordinary HF checkpoint under
    the tracking root's cache; the same inputs reuse the folder.
    """
    if config.backbone.source != "builtin":
        return str(config.backbone.path)
    from slca_exp.core.checking import may_create

    if not may_create():  # a check that only looks (validate, --dry-run): build nothing
        return f"<built at launch under {output_root(config.tracking) / 'cache' / 'backbones'}>"
    from slca_exp.data.splits import load_splits
    from slca_exp.engines.common import run_backbone

    return str(run_backbone(config, load_splits(config)).path)


def chat_template(config: RunConfig) -> str | None:
    """The template's text (verl's ``custom_chat_template`` takes the template, not a path)."""
    path = config.backbone.chat_template
    if not path:
        return None
    try:
        return Path(path).read_text()
    except OSError as err:
        raise ConfigError(
            [Problem("backbone.chat_template", f"cannot read {path!r}: {err}", "fix the path")]
        ) from None


def run_name_of(config: RunConfig, recipe: Recipe | None) -> str:
    """The trackers' run name (``tracking/build.py``); without a recipe, the run folder's key."""
    if recipe is not None:
        from slca_exp.tracking.build import run_name
        from slca_exp.tracking.redact import Redactor

        return run_name(config, recipe, Redactor.for_config(config))
    if config.run_name:
        return config.run_name
    return f"{config.algorithm.name}-{run_key(config)}"


def verl_dir(config: RunConfig) -> Path:
    """``<run folder>/verl``: the translated config, the tool config, verl's checkpoints."""
    return run_dir(config) / "verl"


def worker_env(config: RunConfig) -> dict[str, str]:
    """Environment variables of every Ray worker (``ray_kwargs.ray_init.runtime_env.env_vars``).

    ``VERL_USE_EXTERNAL_MODULES`` names our plugin (after any module this process's
    environment already names); ``SLCA_EXP_PLUGINS`` travels when set; verl's own MLflow and
    W&B loggers are pointed where ours write.
    """
    from slca_exp.plugins import PLUGINS_ENV

    modules = [m.strip() for m in os.environ.get(MODULES_ENV, "").split(",") if m.strip()]
    env: dict[str, str] = {}
    if backend_of(config) == "cpu":  # the platform first: later modules ask verl for it
        modules = [cpu.PLATFORM_MODULE, *modules]
        env.update(cpu.WORKER_ENV)
        if config.engine.verl.cpu_rollout == "vllm":
            env.update(cpu.VLLM_ENV)
        env.update(cpu.thread_env())
        env[cpu.ROLLOUT_LOG_ENV] = str(verl_dir(config) / ROLLOUT_LOG)
    env[MODULES_ENV] = ",".join(dict.fromkeys([*modules, PLUGIN_MODULE]))
    if os.environ.get(PLUGINS_ENV):
        env[PLUGINS_ENV] = os.environ[PLUGINS_ENV]
    if "mlflow" in config.tracking.backends:
        from slca_exp.tracking.mlflow import store_uri

        env["MLFLOW_TRACKING_URI"] = store_uri(config.tracking)
    if "wandb" in config.tracking.backends:
        env["WANDB_MODE"] = config.tracking.wandb_mode
    return env
