"""``engine=verl``, stage 1: SFT on the gold trajectories through verl 0.9.x's own SFT trainer.

    RunConfig (+ Recipe)
      -> sft_config(config, recipe): verl's SFT trainer config (``sft_config.py``)
      -> run_sft: SFT split -> write_sft_data -> check_sft_config (``checks.py``)
         -> <run folder>/verl/sft_trainer.yaml
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
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from slca_exp.config.schema import RunConfig
from slca_exp.core.problems import ConfigError, Problem
from slca_exp.engines.verl.checks import check_sft_config
from slca_exp.engines.verl.keys import SFT_CONFIG_FILE
from slca_exp.engines.verl.sft_config import sft_checkpoint, sft_config
from slca_exp.engines.verl.sft_data import write_sft_data
from slca_exp.engines.verl.side_files import write_verl_config
from slca_exp.engines.verl.translation import backend_of, verl_dir, worker_env
from slca_exp.recipe import Recipe

ENTRY_POINT = "verl.trainer.sft_trainer_ray"
CPU_ENTRY_POINT = "slca_exp.engines.verl.cpu.sft"


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
    path = write_verl_config(cfg, verl_dir(config) / SFT_CONFIG_FILE)
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
