"""Execution engines, one registry: ``ENGINES.get(cfg.engine.name).run(cfg, recipe, tracker)``.

An engine may also have ``check(config, recipe) -> list[Problem]``: its own problems with a
validated config, found before anything starts (``slca_exp.train.prepare`` calls it). An engine
that checkpoints has ``resume_ids(config)`` (the tracker run ids an interrupted run of this exact
config logged to, or ``None``) and ``remember_run_ids(config, ids)``, called as soon as the
trackers' runs are open, before any signal can stop the job: a job requeued at any moment
continues the same runs. An engine that runs on Ray has ``ray_node(config)``, the
``slca_exp.launch.task.NodeResources`` each Ray node of its job declares: its submitit jobs,
one-task ones included, boot their own Ray cluster (``slca_exp.launch.cluster``).

Built-in engines are registered here behind a small proxy that imports their module on first
use, so that composing and validating a recipe never pays for importing transformers. Plugins
(``SLCA_EXP_PLUGINS``) register their own engines the same way.
"""

from __future__ import annotations

import importlib
from typing import Any

from slca_exp.registry import Registry

ENGINES: Registry[Any] = Registry("engine")


class LazyEngine:
    """An engine whose class is imported when it is first used.

    Args:
        target: ``"package.module:ClassName"``.

    """

    def __init__(self, target: str, check: str | None = None) -> None:
        self.target = target
        self.check_target = check
        self._engine: Any = None

    def check(self, config: Any, recipe: Any = None) -> list[Any]:  # noqa: ANN401
        """The engine's own problems with a validated config (``[]``: none, or no check).

        Only the check's module is imported (``check``: ``"package.module:function"``), so
        validating a recipe stays cheap for engines whose check needs nothing heavy.
        """
        if self.check_target is None:
            return []
        module, _, name = self.check_target.partition(":")
        return list(getattr(importlib.import_module(module), name)(config, recipe))

    def load(self) -> Any:  # noqa: ANN401
        """The engine instance (imported and built once)."""
        if self._engine is None:
            module, _, name = self.target.partition(":")
            self._engine = getattr(importlib.import_module(module), name)()
        return self._engine

    def __getattr__(self, attr: str) -> Any:  # noqa: ANN401 - run, resume_ids, ...
        if attr.startswith("_") or attr in ("target", "check_target", "load"):
            raise AttributeError(attr)
        return getattr(self.load(), attr)

    def __repr__(self) -> str:
        return f"LazyEngine({self.target!r})"


ENGINES.register("local", LazyEngine("slca_exp.engines.local.engine:LocalEngine"))
_VERL = "slca_exp.engines.verl.engine"
ENGINES.register("verl", LazyEngine(f"{_VERL}:VerlEngine", check=f"{_VERL}:check"))
