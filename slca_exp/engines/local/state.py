"""A run's folder: its checkpoint and the state that lets the same command resume it.

The folder is ``<tracking.root>/runs/<run key>``, the run key a hash of the whole validated
config: rerunning the same command (same overrides, same seed) finds the same folder, its
checkpoint and the MLflow run it was logging to, and continues at the next step.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from slca_exp.config.paths import run_dir
from slca_exp.config.schema import RunConfig

STATE = "state.json"
CHECKPOINT = "checkpoint.pt"


@dataclass
class RunState:
    """What survives a killed run (``state.json``).

    Attributes:
        status: ``running`` until the run completes, then ``finished``.
        step: RL steps completed.
        sft_done: the SFT stage is behind us (its weights are in the checkpoint).
        run_ids: tracker run ids to resume, e.g. ``{"mlflow": "..."}``.
        val: validation summaries logged so far, by label.

    """

    status: str = "running"
    step: int = 0
    sft_done: bool = False
    run_ids: dict[str, str] = field(default_factory=dict)
    val: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def load(cls, folder: Path) -> RunState | None:
        """The state in ``folder``, or ``None`` when there is none (or it is unreadable)."""
        try:
            data = json.loads((folder / STATE).read_text())
        except (OSError, ValueError):
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, folder: Path) -> None:
        """Write ``state.json`` atomically."""
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / (STATE + ".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True))
        os.replace(tmp, folder / STATE)


def resumable(config: RunConfig) -> RunState | None:
    """The state of an unfinished earlier run of this exact config, if any."""
    state = RunState.load(run_dir(config))
    return state if state is not None and state.status != "finished" else None


def save_checkpoint(
    folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: RunState
) -> None:
    """Model and optimizer weights, RNG states, then ``state.json`` (the commit point)."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
    }
    tmp = folder / (CHECKPOINT + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, folder / CHECKPOINT)
    state.save(folder)


def load_checkpoint(
    folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> bool:
    """Restore what :func:`save_checkpoint` wrote; ``False`` when there is no checkpoint."""
    path = folder / CHECKPOINT
    if not path.is_file():
        return False
    payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(payload["model"])
    if optimizer is not None and payload.get("optimizer") is not None:
        optimizer.load_state_dict(payload["optimizer"])
    torch.set_rng_state(payload["torch_rng"])
    random.setstate(payload["python_rng"])
    return True
