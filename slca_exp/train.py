"""The Hydra task behind ``slca-exp train``: validate, then hand the run to its engine."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from slca_exp.config.compose import CONFIG_DIR, CONFIG_NAME
from slca_exp.config.schema import RunConfig
from slca_exp.config.validate import ConfigError, validate
from slca_exp.engines import ENGINES
from slca_exp.registry import RegistryError


def run(cfg: DictConfig) -> object:
    """Validate ``cfg`` and run it on its engine; returns the engine's result.

    Raises:
        ConfigError: the config has problems (all of them listed).
        RegistryError: no engine of that name is installed.

    """
    config: RunConfig = validate(cfg)
    engine = ENGINES.get(config.engine.name)
    return engine.run(config)  # type: ignore[attr-defined]


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=CONFIG_NAME)
def main(cfg: DictConfig) -> object:
    """Hydra entry point; a bad recipe or a missing engine exits with status 2, no traceback."""
    try:
        return run(cfg)
    except (ConfigError, RegistryError) as err:
        print(f"slca-exp: {err}", file=sys.stderr)
        if isinstance(err, RegistryError):
            print(
                "slca-exp: this version has no engine installed yet; "
                "`slca-exp train --cfg job` prints the composed recipe.",
                file=sys.stderr,
            )
        sys.exit(2)
