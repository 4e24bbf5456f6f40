"""``engine=verl``, stage 1: SFT on the gold trajectories through verl 0.9.x's own SFT trainer.

    RunConfig (+ Recipe)
      -> verl's own ``sft_trainer_engine`` composed with Hydra from verl's packaged config folder
      -> our values, one verl key each (:func:`sft_values`; :data:`SOURCES` names our key)
      -> ``engine.verl.sft_overrides``, applied last with Hydra's override syntax
      == sft_config(config, recipe)                    (DictConfig, interpolations kept)
      -> check_sft_config(cfg): verl's own checks on CPU (list[Problem], empty when valid)
      -> run_sft: SFT split -> write_sft_data -> <run folder>/verl/sft_trainer.yaml
         -> sft_command: ``python -m verl.trainer.sft_trainer_ray --config-path ... --config-name``
      == sft_checkpoint(cfg): ``<run folder>/verl/sft/global_step_<steps>/huggingface``,
         what the RL stage's ``actor_rollout_ref.model.path`` points at

Entry point. verl 0.9.1 ships two SFT trainers that share one config (``sft_trainer_engine``):
``verl.trainer.sft_trainer`` is SPMD (``torchrun`` on every node, a rendezvous of its own, each
rank building its engine) and ``verl.trainer.sft_trainer_ray`` is a single driver that calls
``ray.init()`` and places one ``TrainingWorker`` per GPU (``trainer.nnodes`` x
``trainer.n_gpus_per_node``) on the Ray cluster. We launch the Ray one: on SLURM our launcher
already boots a Ray cluster in the allocation and exports ``RAY_ADDRESS``
(:mod:`slca_exp.launch.cluster`), which ``ray.init()`` joins, exactly as the RL stage's trainer
does; on one machine without ``RAY_ADDRESS`` the same ``ray.init()`` starts a local cluster. A
torchrun launch would need a second way to start processes on every node for this stage only.

Data: :mod:`slca_exp.engines.verl.sft_data` writes the split as JSON columns and holds the
dataset class the config names (verl's own, decoding them).

Composing needs only verl's YAML files; checking, the dataset class and running import verl.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import subprocess
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from slca_exp.config.schema import RunConfig
from slca_exp.config.validate import ConfigError, Problem
from slca_exp.engines.verl import cpu, sft_data
from slca_exp.engines.verl.config import (
    backend_of,
    chat_template,
    keyed_problem,
    model_path,
    run_name_of,
    translated,
    unresolved,
    verl_dir,
    worker_env,
    write_verl_config,
)
from slca_exp.engines.verl.sft_data import DATASET_CLASS, MESSAGES, TOOLS, write_sft_data
from slca_exp.recipe import Recipe

CONFIG_NAME = "sft_trainer_engine"
"""verl's SFT trainer config (``verl/trainer/config/sft_trainer_engine.yaml``)."""
CONFIG_FILE = "sft_trainer.yaml"
"""The translated config, written into ``<run folder>/verl``."""
ENTRY_POINT = "verl.trainer.sft_trainer_ray"
CPU_ENTRY_POINT = "slca_exp.engines.verl.cpu.sft"
DATA_FILE = Path("sft_data") / "sft.parquet"
CHECKPOINTS = "sft"
HF_FOLDER = "huggingface"
"""verl's checkpoint manager writes the HF weights into ``global_step_<N>/huggingface``."""
EXPERIMENT_SUFFIX = "-sft"

SOURCES: dict[str, str] = {
    "model.path": "backbone.path",
    "model.custom_chat_template": "backbone.chat_template",
    "data.train_files": "data.files.sft (converted by slca-exp)",
    "data.max_length": "engine.sft.max_len",
    "data.train_batch_size": "engine.sft.batch_size",
    "optim.lr": "engine.sft.lr",
    "trainer.total_training_steps": "engine.sft.steps",
    "trainer.total_epochs": "engine.sft.steps",
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
            "trainer.total_training_steps": sft.steps,
            # an upper bound: verl stops at total_training_steps, which needs this many epochs
            # at most (one step per epoch when the split holds a single batch)
            "trainer.total_epochs": max(1, sft.steps),
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
    if backend_of(config) == "cpu":
        values.update(cpu.sft_values())
    return values


def sft_checkpoint(cfg: DictConfig) -> Path:
    """Where verl leaves the HF-format weights of the finished SFT stage.

    verl's ``CheckpointHandler.save_checkpoint(step)`` saves into
    ``<trainer.default_local_dir>/global_step_<step>`` (and writes the step into
    ``latest_checkpointed_iteration.txt`` there); with ``hf_model`` among
    ``checkpoint.save_contents`` the checkpoint manager writes the weights, config and tokenizer
    into its ``huggingface`` folder. The last step is ``trainer.total_training_steps``.
    """
    step = int(cfg.trainer.total_training_steps)
    return Path(cfg.trainer.default_local_dir) / f"global_step_{step}" / HF_FOLDER


def sft_command(cfg_path: str | Path, backend: str = "cuda") -> list[str]:
    """The command that runs verl's Ray SFT trainer, unmodified, on a written config.

    Hydra's run folder (verl's ``hydra.main`` changes into it) goes next to the config. On the
    ``cpu`` backend the trainer is started by :mod:`slca_exp.engines.verl.cpu.sft`, which joins
    the run's Ray cluster with the workers' environment (verl's entry point starts a Ray of
    its own).
    """
    path = Path(cfg_path).resolve()
    if backend == "cpu":
        return [sys.executable, "-m", CPU_ENTRY_POINT, str(path)]
    return [
        sys.executable,
        "-m",
        ENTRY_POINT,
        f"--config-path={path.parent}",
        f"--config-name={path.stem}",
        f"hydra.run.dir={path.parent / 'sft_hydra'}",
    ]


def run_sft(
    config: RunConfig, recipe: Recipe | None = None, *, env: Mapping[str, str] | None = None
) -> Path | None:
    """Run the SFT stage with verl's SFT trainer; the HF weights the RL stage starts from.

    Converts the SFT split into ``<run folder>/verl/sft_data``, checks the translated config,
    writes ``<run folder>/verl/sft_trainer.yaml`` and runs :func:`sft_command` (which joins
    the Ray cluster of ``RAY_ADDRESS`` when set) with verl's loggers pointed where ours write.
    A run whose weights are already there is not repeated.

    Args:
        config: the run config.
        recipe: its recipe (the SFT split it checked).
        env: more variables for verl's processes (the engine's: the tracker run ids, so that
            the SFT stage logs into the run that holds the recipe).

    Returns:
        :func:`sft_checkpoint`, or ``None`` when ``engine.sft.enabled`` is false (the RL stage
        then starts from ``backbone.path``).

    Raises:
        ConfigError: verl refuses the config, or there is no SFT split (every problem at once).
        DataError: the SFT split is missing or its rows break the layout.
        RuntimeError: verl's trainer failed or left no weights.

    """
    if not config.engine.sft.enabled:
        return None
    cfg = sft_config(config, recipe)
    weights = sft_checkpoint(cfg)
    if _has_weights(weights):
        return weights
    from slca_exp.data.splits import load_split

    write_sft_data(load_split(_sft_split(config, recipe), "sft").rows, cfg.data.train_files)
    problems = check_sft_config(cfg)  # after the data is written: its size is checked too
    if problems:
        raise ConfigError(problems)
    path = write_verl_config(cfg, verl_dir(config) / CONFIG_FILE)
    child_env = {**os.environ, **worker_env(config), **(env or {})}
    command = sft_command(path, backend_of(config))
    result = subprocess.run(command, env=child_env, check=False)  # noqa: S603
    if result.returncode != 0:
        raise RuntimeError(
            f"verl's SFT trainer ({command[2]}) exited with code {result.returncode}; its log "
            f"is above, its config in {path}"
        )
    if not _has_weights(weights):
        raise RuntimeError(f"verl's SFT trainer finished without writing weights to {weights}")
    return weights


def finished_sft(config: RunConfig, recipe: Recipe | None = None) -> Path | None:
    """The weights of this run's finished SFT stage, or ``None`` (not run yet, or SFT is off)."""
    if not config.engine.sft.enabled:
        return None
    weights = sft_checkpoint(sft_config(config, recipe))
    return weights if _has_weights(weights) else None


def _has_weights(folder: Path) -> bool:
    """Whether verl saved the HF weights there (it writes config and tokenizer in any case)."""
    return any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))


def _sft_split(config: RunConfig, recipe: Recipe | None) -> Path:
    """The SFT split: the recipe's checked file, else the config's (synthetic: generated)."""
    files = (recipe.data.get("files") if recipe is not None else None) or {}
    if (files.get("sft") or {}).get("path"):
        return Path(files["sft"]["path"])
    from slca_exp.data.splits import split_files

    found = split_files(config)
    if "sft" not in found:
        raise ConfigError(
            [
                Problem(
                    "data.files.sft",
                    "engine.sft.enabled=true needs an SFT split and the data has none",
                    "point data.files.sft at gold trajectories, or set engine.sft.enabled=false",
                )
            ]
        )
    return found["sft"]


# --- verl's own checks -------------------------------------------------------------------------


def check_sft_config(cfg: DictConfig) -> list[Problem]:
    """Run what verl's SFT trainer checks before it trains, on CPU; every problem found.

    The dataclass conversions of ``SFTTrainer._build_config`` (engine, optim, checkpoint,
    profiler) and its profile-interval check, the engine registry it builds the engine from,
    the dataset class ``data.custom_cls`` names, the loggers ``Tracking`` knows, and what fails
    once on GPUs: a global batch that does not split over the data-parallel ranks (verl's
    balanced partitions and dispatch), sequences longer than dynamic batching takes, no step
    to train, a converted split smaller than one batch. Not checked here: the model files
    (``HFModelConfig`` reads them) and the rows' tokens.

    Args:
        cfg: a config from :func:`sft_config` (left unchanged).

    Returns:
        Problems keyed by the verl key; each fix names the key of ours it comes from.

    """
    cfg = copy.deepcopy(cfg)
    problems = unresolved(cfg, _problem)
    if problems:
        return problems
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # verl warns about optional engines it cannot import
        return _verl_checks(cfg) + _gpu_checks(cfg)


def _verl_checks(cfg: DictConfig) -> list[Problem]:
    from types import SimpleNamespace

    from verl.trainer.sft_trainer_ray import SFTTrainer
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.import_utils import load_extern_object
    from verl.utils.tracking import Tracking
    from verl.workers.engine import EngineRegistry

    problems = []
    for section in ("engine", "optim", "checkpoint", "profiler"):  # as SFTTrainer._build_config
        try:
            omega_conf_to_dataclass(cfg[section])
        except Exception as err:  # noqa: BLE001 - any failure of verl's conversion is a problem
            key = f"{section}.{err.full_key}" if getattr(err, "full_key", None) else section
            problems.append(_problem(key, f"verl: {_verl_error(err)}"))
    interval = SimpleNamespace(profiler_interval=list(cfg.trainer.profile_interval))
    try:
        SFTTrainer._validate_profiler_interval(interval)
    except (AssertionError, TypeError) as err:
        problems.append(_problem("trainer.profile_interval", f"verl refuses it {err}".strip()))
    engines = EngineRegistry._engines.get("language_model", {})
    if cfg.engine.strategy not in engines:
        problems.append(
            _problem(
                "engine.strategy",
                f"verl has no {cfg.engine.strategy!r} engine here",
                f"one of {', '.join(engines)}",
            )
        )
    custom = cfg.data.custom_cls
    if custom.get("path"):
        try:
            load_extern_object(custom.path, custom.name)
        except Exception as err:  # noqa: BLE001 - the trainer's failure, reported here
            problems.append(_problem("data.custom_cls", f"verl cannot load it: {err}"))
    for i, name in enumerate(cfg.trainer.logger or []):
        if name not in Tracking.supported_backend:
            known = ", ".join(Tracking.supported_backend)
            problems.append(_problem(f"trainer.logger[{i}]", f"verl knows no {name!r}", known))
    return problems


def _verl_error(err: BaseException) -> str:
    """The message of an error of verl's; for a bare ``assert``, the line that failed."""
    text = " ".join(str(err).split()) or type(err).__name__
    cause = err.__cause__ or err
    if isinstance(cause, AssertionError) and not str(cause) and cause.__traceback__:
        import traceback

        text += f" ({traceback.extract_tb(cause.__traceback__)[-1].line})"
    return text


def _gpu_checks(cfg: DictConfig) -> list[Problem]:
    """What fails only once the trainer runs on GPUs (``sft_trainer_ray``, ``engine/utils``)."""
    data, trainer = cfg.data, cfg.trainer
    gpus = trainer.nnodes * trainer.n_gpus_per_node
    sp = int(cfg.engine.get("ulysses_sequence_parallel_size") or 1)
    problems = []
    if gpus % sp:
        problems.append(
            _problem(
                "engine.ulysses_sequence_parallel_size",
                f"a sequence-parallel group of {sp} GPUs does not divide the {gpus} GPUs",
                "pick a size that divides the GPUs per node",
            )
        )
    dp = max(1, gpus // sp)
    if data.train_batch_size % dp:
        problems.append(
            _problem(
                "data.train_batch_size",
                f"a global batch of {data.train_batch_size} trajectories does not split over "
                f"{dp} data-parallel ranks (nnodes x n_gpus_per_node / sequence parallel)",
                f"make it a multiple of {dp} (with engine.verl.nnodes and n_gpus_per_node)",
            )
        )
    if data.use_dynamic_bsz and data.max_token_len_per_gpu * sp < data.max_length:
        problems.append(
            _problem(
                "data.max_token_len_per_gpu",
                f"dynamic batching packs at most {data.max_token_len_per_gpu * sp} tokens per GPU, "
                f"below data.max_length={data.max_length}",
                f"raise it to at least {data.max_length}",
            )
        )
    if trainer.total_training_steps is None or trainer.total_training_steps < 1:
        problems.append(
            _problem(
                "trainer.total_training_steps",
                "verl's SFT trainer needs at least one step (it saves at the last one)",
                "set engine.sft.steps >= 1, or engine.sft.enabled=false",
            )
        )
    train = Path(str(data.train_files))
    if train.is_file():  # written at launch; checked when it is here
        import pyarrow.parquet as pq

        rows = pq.ParquetFile(train).metadata.num_rows
        if rows < data.train_batch_size:
            problems.append(
                _problem(
                    "data.train_batch_size",
                    f"{train} holds {rows} trajectories, fewer than one batch (verl drops the "
                    "last incomplete batch, so an epoch would have no step)",
                    f"use at most {rows}",
                )
            )
    return problems


def _problem(key: str, what: str, fix: str = "") -> Problem:
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
