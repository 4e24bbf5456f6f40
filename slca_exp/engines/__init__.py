"""Execution engines, one registry: ``ENGINES.get(cfg.engine.name).run(cfg, recipe, tracker)``.

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

    def __init__(self, target: str) -> None:
        self.target = target
        self._engine: Any = None

    def load(self) -> Any:  # noqa: ANN401
        """The engine instance (imported and built once)."""
        if self._engine is None:
            module, _, name = self.target.partition(":")
            self._engine = getattr(importlib.import_module(module), name)()
        return self._engine

    def __getattr__(self, attr: str) -> Any:  # noqa: ANN401 - run, resume_ids, ...
        if attr.startswith("_") or attr in ("target", "load"):
            raise AttributeError(attr)
        return getattr(self.load(), attr)

    def __repr__(self) -> str:
        return f"LazyEngine({self.target!r})"


ENGINES.register("local", LazyEngine("slca_exp.engines.local.engine:LocalEngine"))
