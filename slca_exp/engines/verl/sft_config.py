"""``engine=verl``, stage 1: the run config translated into verl 0.9.x's SFT trainer config.

    RunConfig (+ Recipe)
      -> verl's own ``sft_trainer_engine`` composed with Hydra from verl's packaged config folder
      -> our values, one verl key each (:func:`sft_values`; :data:`SOURCES` names our key)
      -> ``engine.verl.sft_overrides``, applied last with Hydra's override syntax
      == sft_config(config, recipe)                    (DictConfig, interpolations kept)
      -> check_sft_config(cfg): verl's own checks on CPU (``checks.py``; list[Problem])
      == sft_checkpoint(cfg): ``<run folder>/verl/sft/global_step_<steps>/huggingface``,
         what the RL stage's ``actor_rollout_ref.model.path`` points at

The split is read through the dataset class of :mod:`slca_exp.engines.verl.sft_data` (verl's
own, decoding our JSON columns); ``sft.py`` runs the stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from slca_exp.config.schema import RunConfig
from slca_exp.core.problems import Problem
from slca_exp.engines.verl import cpu, sft_data
from slca_exp.engines.verl.problems import keyed_problem
from slca_exp.engines.verl.sft_data import DATASET_CLASS, MESSAGES, TOOLS
from slca_exp.engines.verl.translation import (
    backend_of,
    chat_template,
    model_path,
    run_name_of,
    translated,
    verl_dir,
)
from slca_exp.recipe import Recipe

CONFIG_NAME = "sft_trainer_engine"
"""verl's SFT trainer config (``verl/trainer/config/sft_trainer_engine.yaml``)."""
DATA_FILE = Path("sft_data") / "sft.parquet"
CHECKPOINTS = "sft"
HF_FOLDER = "huggingface"
"""verl's checkpoint manager writes the HF weights into ``global_step_<N>/huggingface``."""
TRACKER_FILE = "latest_checkpointed_iteration.txt"
"""verl's checkpoint handler records the step it saved last in this file."""
EXPERIMENT_SUFFIX = "-sft"

SOURCES: dict[str, str] = {
    "model.path": "backbone.path",
    "model.custom_chat_template": "backbone.chat_template",
    "data.train_files": "data.files.sft (converted by slca-exp)",
    "data.max_length": "engine.sft.max_len",
    "data.train_batch_size": "engine.sft.batch_size",
    "optim.lr": "engine.sft.lr",
    "trainer.total_training_steps": (
        "engine.sft.steps, or engine.verl.sft_epochs x the SFT split's batches"
    ),
    "trainer.total_epochs": "engine.verl.sft_epochs, else engine.sft.steps",
    "optim.lr_scheduler_type": "engine.verl.sft_lr_scheduler",
    "optim.lr_warmup_steps_ratio": "engine.verl.sft_warmup_ratio",
    "optim.weight_decay": "engine.verl.sft_weight_decay",
    "data.micro_batch_size_per_gpu": "engine.verl.sft_micro_batch_size_per_gpu",
    "data.use_dynamic_bsz": "engine.verl.sft_micro_batch_size_per_gpu (set: off)",
    "trainer.nnodes": "engine.verl.nnodes",
    "trainer.n_gpus_per_node": "engine.verl.n_gpus_per_node",
    "engine.strategy": "engine.verl.strategy",
    "trainer.logger": "tracking.backends",
    "trainer.project_name": "tracking.wandb_project, else experiment_name",
    "trainer.experiment_name": "run_name",
    "trainer.seed": "seed",
    "engine.seed": "seed",
    **{key: "engine.verl.backend (cpu)" for key in cpu.SFT_KEYS},
}
"""verl key -> the key of ours it is translated from (a problem's fix names it)."""

FIELD_KEYS: dict[str, tuple[str, ...]] = {
    "sft_epochs": ("trainer.total_epochs", "trainer.total_training_steps"),
    "sft_lr_scheduler": ("optim.lr_scheduler_type",),
    "sft_warmup_ratio": ("optim.lr_warmup_steps_ratio",),
    "sft_micro_batch_size_per_gpu": ("data.micro_batch_size_per_gpu", "data.use_dynamic_bsz"),
    "sft_weight_decay": ("optim.weight_decay",),
}
"""``engine.verl.sft_<field>`` -> the verl keys of the SFT config it sets (:func:`sft_values`)."""

FIXED: dict[str, Any] = {
    "data.messages_key": MESSAGES,
    "data.tools_key": TOOLS,
    "data.val_files": None,
    "data.custom_cls.path": f"pkg://{sft_data.__name__}",
    "data.custom_cls.name": DATASET_CLASS,
    # engine.sft.max_len: "longer ones are cut", as in the local engine (verl's default: error)
    "data.truncation": "right",
    # verl tokenizes turn by turn and compares with the whole chat rendered at once; ChatML
    # templates put consecutive tool responses (parallel calls) into one user turn, which the
    # per-turn rendering splits. The assistant tokens and their mask are the same either way.
    "data.ignore_input_ids_mismatch": True,
    # the RL stage starts from these HF weights (verl's default saves only FSDP shards)
    "checkpoint.save_contents": ["model", "optimizer", "extra", "hf_model"],
    "trainer.save_freq": -1,  # verl saves at the last step anyway
    "trainer.test_freq": -1,
}
"""verl values every SFT config has."""


def sft_config(config: RunConfig, recipe: Recipe | None = None) -> DictConfig:
    """The complete config of verl's SFT trainer for a run's SFT stage.

    Args:
        config: the validated run config (``engine.sft`` and ``engine.verl``).
        recipe: its recipe, when built: the trackers' run name.

    Returns:
        verl's composed ``sft_trainer_engine`` with our values, then
        ``engine.verl.sft_overrides``; verl's own interpolations are kept.

    Raises:
        ConfigError: verl is not installed, the backbone cannot run on verl, or an override is
            bad (each problem names its key).

    """
    return translated(
        config,
        CONFIG_NAME,
        sft_values(config, recipe),
        config.engine.verl.sft_overrides,
        "engine.verl.sft_overrides",
        new_keys=cpu.SFT_NEW_KEYS,
    )


def sft_values(config: RunConfig, recipe: Recipe | None = None) -> dict[str, Any]:
    """Our values by verl key: :data:`SOURCES` and :data:`FIXED`."""
    sft, v, folder = config.engine.sft, config.engine.verl, verl_dir(config)
    values = dict(FIXED)
    values.update(
        {
            "model.custom_chat_template": chat_template(config),
            "data.train_files": str(folder / DATA_FILE),  # write_sft_data writes it at launch
            "data.max_length": sft.max_len,
            "data.train_batch_size": sft.batch_size,
            "optim.lr": sft.lr,
            "optim.lr_scheduler_type": v.sft_lr_scheduler,
            "optim.lr_warmup_steps_ratio": v.sft_warmup_ratio,
            "optim.weight_decay": v.sft_weight_decay,
            **sft_length(config, recipe),
            "trainer.nnodes": v.nnodes,
            "trainer.n_gpus_per_node": v.n_gpus_per_node,
            "engine.strategy": v.strategy,
            "trainer.logger": list(config.tracking.backends),  # verl has the same three names
            "trainer.project_name": config.tracking.wandb_project or config.experiment_name,
            "trainer.experiment_name": run_name_of(config, recipe) + EXPERIMENT_SUFFIX,
            "trainer.default_local_dir": str(folder / CHECKPOINTS),
            "trainer.seed": config.seed,
            "engine.seed": config.seed,
            "model.path": model_path(config, recipe),
        }
    )
    if v.sft_micro_batch_size_per_gpu is not None:  # fixed micro-batches, the rest accumulated
        values["data.micro_batch_size_per_gpu"] = v.sft_micro_batch_size_per_gpu
        values["data.use_dynamic_bsz"] = False
    if backend_of(config) == "cpu":
        values.update(cpu.sft_values())
    return values


def sft_length(config: RunConfig, recipe: Recipe | None = None) -> dict[str, Any]:
    """``trainer.total_training_steps`` and ``trainer.total_epochs`` of the SFT stage.

    ``engine.sft.steps`` steps, with as many epochs as an upper bound (verl stops at
    ``total_training_steps``; one step per epoch when the split holds a single batch). With
    ``engine.verl.sft_epochs``: that many epochs of ``rows // engine.sft.batch_size`` steps
    each (verl drops the last incomplete batch), counted here from the SFT split's rows when
    they are known (:func:`sft_rows`); otherwise ``null``, and verl counts them itself.
    """
    sft, epochs = config.engine.sft, config.engine.verl.sft_epochs
    if epochs is None:
        return {
            "trainer.total_training_steps": sft.steps,
            "trainer.total_epochs": max(1, sft.steps),
        }
    rows = sft_rows(config, recipe)
    steps = None if rows is None else epochs * (rows // sft.batch_size)
    return {"trainer.total_training_steps": steps, "trainer.total_epochs": epochs}


def sft_rows(config: RunConfig, recipe: Recipe | None = None) -> int | None:
    """Rows of the SFT split: the recipe's count, else the file's on this host, else ``None``.

    Every row is trained on (``write_sft_data`` converts them all or refuses the split).
    """
    files = (recipe.data.get("files") if recipe is not None else None) or {}
    if (files.get("sft") or {}).get("rows") is not None:
        return int(files["sft"]["rows"])
    from slca_exp.data.sources import data_source

    path = data_source(config.data.kind).planned(config).get("sft")
    if path is None or not Path(path).is_file():
        return None
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def sft_checkpoint(cfg: DictConfig) -> Path:
    """Where verl leaves the HF-format weights of the finished SFT stage.

    verl's ``CheckpointHandler.save_checkpoint(step)`` saves into
    ``<trainer.default_local_dir>/global_step_<step>`` (and writes the step into
    ``latest_checkpointed_iteration.txt`` there); with ``hf_model`` among
    ``checkpoint.save_contents`` the checkpoint manager writes the weights, config and tokenizer
    into its ``huggingface`` folder. The last step is ``trainer.total_training_steps``; when
    verl counts it itself (epochs of a split whose size was not known), the step verl recorded
    last (``global_step_0`` before it saved any).
    """
    folder = Path(cfg.trainer.default_local_dir)
    step = cfg.trainer.total_training_steps
    if step is None:
        try:
            step = int((folder / TRACKER_FILE).read_text().strip())
        except (OSError, ValueError):
            step = 0
    return folder / f"global_step_{int(step)}" / HF_FOLDER


def sft_problem(key: str, what: str, fix: str = "") -> Problem:
    """A problem on verl key ``key`` of the SFT config; the fix names our key."""
    return keyed_problem(
        key,
        what,
        fix,
        sources=SOURCES,
        fixed=FIXED,
        overrides="engine.verl.sft_overrides",
        also={},
    )
