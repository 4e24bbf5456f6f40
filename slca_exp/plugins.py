"""User plugins: modules named in ``$SLCA_EXP_PLUGINS`` are imported before a recipe is checked.

A plugin registers its own entries at import time, so a recipe names them like built-in ones
and validation checks the names against the registries, the plugin's entries included:

    registry                                   entry                              picked with
    slca_exp.estimators.register_estimator     an advantage estimator             algorithm.name
    slca_exp.judges.JUDGES                     a JudgeBase subclass (remote?)     judge.backend
    slca_exp.simulators.SIMULATORS             a SimulatorBase subclass (remote?) simulator.backend
    slca_exp.tracking.TRACKERS                 a TrackerBackend (keeps files?)    tracking.backends
    slca_exp.data.sources.DATA_SOURCES         a DataSource                       data.kind
    slca_exp.engines.ENGINES                   an Engine, with its config schema  engine.name

For example:

    export SLCA_EXP_PLUGINS=my_lab.estimators,my_lab.judges
    slca-exp train algorithm.name=my_estimator judge.backend=my_judge

The variable is read in every process that composes or runs a recipe (the CLI, each Hydra job,
each submitit or SLURM task, which inherit the environment), so a plugin is never missing from a
job that runs elsewhere.
"""

from __future__ import annotations

import importlib
import os

from slca_exp.core.problems import ConfigError, Problem

PLUGINS_ENV = "SLCA_EXP_PLUGINS"


def plugin_modules() -> list[str]:
    """Module names listed in ``$SLCA_EXP_PLUGINS`` (comma-separated), in order."""
    return [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


def load_plugins() -> list[str]:
    """Import every plugin module (a module already imported is not run again).

    Raises:
        ConfigError: naming each module that could not be imported, and why.

    """
    problems = []
    for name in plugin_modules():
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - any failure of user code is reported, not raised
            problems.append(
                Problem(
                    f"${PLUGINS_ENV}",
                    f"plugin module {name!r} failed to import: {type(err).__name__}: {err}",
                    f"make {name!r} importable (installed, or on PYTHONPATH) or remove it from "
                    f"{PLUGINS_ENV}",
                )
            )
    if problems:
        raise ConfigError(problems)
    return plugin_modules()
