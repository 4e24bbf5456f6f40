"""Execution engines, one registry: ``ENGINES.get(cfg.engine.name).run(cfg, recipe, tracker)``.

Engines register themselves here when their module is imported; the local engine (CPU or one
GPU) and the verl engine (clusters) are added by their own packages.
"""

from slca_exp.registry import Registry

ENGINES: Registry[object] = Registry("engine")
