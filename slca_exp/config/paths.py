"""Where a run's files live: the tracking root and each run's own folder.

    <tracking.root>/                  output_root(tracking): the store, caches, data, runs
        runs/<run key>/               run_dir(config): state.json, checkpoints, side files

The run key is a digest of the validated config, so a command line run again (a requeued SLURM
job, a rerun after a crash) finds its folder and continues.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from slca_exp.config.schema import RunConfig, TrackingConfig


def output_root(tracking: TrackingConfig) -> Path:
    """``tracking.root`` as an absolute path (relative roots are taken from the launch folder)."""
    return Path(tracking.root).expanduser().resolve()


def run_key(config: RunConfig) -> str:
    """Hex digest (16 characters) of the validated config: one key per command line."""
    blob = json.dumps(dataclasses.asdict(config), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_dir(config: RunConfig) -> Path:
    """``<tracking.root>/runs/<run key>``."""
    return output_root(config.tracking) / "runs" / run_key(config)
