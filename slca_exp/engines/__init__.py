"""Execution engines, one registry: ``ENGINES.get(config.engine.name).run(...)``.

Every engine is an :class:`~slca_exp.engines.base.Engine` (``engines/base.py`` lists what it
provides: its config schema, its own check, what ``--cfg``/``--dry-run`` show of it, its Ray
node, resuming, the run). An engine that checkpoints continues an interrupted run: its
``resume_ids(config)`` are the tracker runs an interrupted run of this exact config logged to,
and ``remember_run_ids(config, ids)`` is called as soon as the trackers' runs are open, before
any signal can stop the job, so that a job requeued at any moment continues the same runs. An
engine that runs on Ray declares the ``slca_exp.core.task.NodeResources`` of each Ray node of
its job (``ray_node``): its submitit jobs, one-task ones included, boot their own Ray cluster
(``slca_exp.launch.cluster``).

Built-in engines are registered here behind a small proxy that imports their module on first
use, so that composing and validating a recipe never pays for importing transformers; their
schemas are light modules. Plugins (``SLCA_EXP_PLUGINS``) register their own engines with
``ENGINES.register(name, engine)``, their schema included.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slca_exp.config.schema import EngineConfig
from slca_exp.engines.base import Engine, EngineRegistry, PluginEngine, as_engine, engine_schema
from slca_exp.engines.local.schema import LocalEngineConfig
from slca_exp.engines.verl.schema import VerlEngineConfig

if TYPE_CHECKING:
    from slca_exp.config.schema import RunConfig
    from slca_exp.core.problems import Problem
    from slca_exp.core.task import NodeResources

ENGINES = EngineRegistry("engine")


class LazyEngine(Engine):
    """An engine whose class is imported when it is first used.

    Args:
        target: ``"package.module:ClassName"``.
        schema: its config schema (a light module, imported now).
        checkpointable: it continues an interrupted run.
        check: ``"package.module:function"``, its own check, imported alone so that validating
            a recipe stays cheap for an engine whose check needs nothing heavy; None: no check.

    """

    def __init__(
        self,
        target: str,
        *,
        schema: type[EngineConfig] = EngineConfig,
        checkpointable: bool = False,
        check: str | None = None,
    ) -> None:
        self.target = target
        self.schema = schema  # type: ignore[misc]
        self.checkpointable = checkpointable  # type: ignore[misc]
        self.check_target = check
        self._engine: Engine | None = None

    def load(self) -> Engine:
        """The engine instance (imported and built once)."""
        if self._engine is None:
            module, _, name = self.target.partition(":")
            self._engine = getattr(importlib.import_module(module), name)()
        return self._engine

    def check(self, config: RunConfig, recipe: Any = None) -> list[Problem]:  # noqa: ANN401, D102
        if self.check_target is None:
            return []
        module, _, name = self.check_target.partition(":")
        return list(getattr(importlib.import_module(module), name)(config, recipe))

    def describe(self, config: RunConfig, *, write: bool) -> str:  # noqa: D102
        return self.load().describe(config, write=write)

    def ray_node(self, config: RunConfig) -> NodeResources | None:  # noqa: D102
        return self.load().ray_node(config)

    def resume_ids(self, config: RunConfig) -> dict[str, str] | None:  # noqa: D102
        return self.load().resume_ids(config)

    def remember_run_ids(self, config: RunConfig, run_ids: dict[str, str]) -> None:  # noqa: D102
        self.load().remember_run_ids(config, run_ids)

    def checkpoint(self, config: RunConfig) -> Path | None:  # noqa: D102
        return self.load().checkpoint(config)

    def run(self, config: RunConfig, recipe: Any, tracker: Any) -> object:  # noqa: ANN401, D102
        return self.load().run(config, recipe, tracker)

    def __repr__(self) -> str:
        return f"LazyEngine({self.target!r})"


ENGINES.register(
    "local",
    LazyEngine(
        "slca_exp.engines.local.engine:LocalEngine",
        schema=LocalEngineConfig,
        checkpointable=True,
    ),
)
_VERL = "slca_exp.engines.verl.engine"
ENGINES.register(
    "verl",
    LazyEngine(
        f"{_VERL}:VerlEngine", schema=VerlEngineConfig, checkpointable=True, check=f"{_VERL}:check"
    ),
)

__all__ = [
    "ENGINES",
    "Engine",
    "EngineRegistry",
    "LazyEngine",
    "PluginEngine",
    "as_engine",
    "engine_schema",
]
