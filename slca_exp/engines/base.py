"""What an engine is: the class every registered engine is, and the registry that holds them.

    ENGINES.get(config.engine.name) -> Engine
        .schema            its config: EngineConfig or a subclass with its own keys
        .check(config, recipe) -> [Problem]       before anything starts (validate, --dry-run)
        .describe(config, write=...) -> str       what --cfg job prints, --dry-run writes
        .ray_node(config) -> NodeResources | None what each Ray node of its SLURM job declares
        .resume_ids(config) / .remember_run_ids(config, ids)   continue an interrupted run
        .run(config, recipe, tracker)             the run itself
        .checkpoint(config) -> Path | None        where its checkpoint is (the closing block)

Generic code (``preflight``, ``train``, ``cli``) calls these on any engine, built-in or a
plugin's, and never asks which engine it is. A plugin subclasses :class:`Engine` (only ``run``
is required) or registers any object with a ``run`` method: :meth:`EngineRegistry.register`
gives it the defaults of the methods it lacks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hydra.core.config_store import ConfigStore

from slca_exp.config.schema import EngineConfig
from slca_exp.registry import Registry

if TYPE_CHECKING:
    from slca_exp.config.schema import RunConfig
    from slca_exp.core.problems import Problem
    from slca_exp.core.task import NodeResources


class Engine(ABC):
    """An execution engine; subclass it and register an instance (``register_engine``).

    Attributes:
        schema: the dataclass of its ``engine`` config. An engine with settings of its own
            extends :class:`~slca_exp.config.schema.EngineConfig`; its option file in
            ``conf/engine/`` then starts with ``defaults: [/schema/engine_<name>@_here_,
            _self_]`` (``register_engine`` stores the schema under that name).
        checkpointable: it checkpoints and continues an interrupted run (``resume_ids``): a
            SLURM time limit then checkpoints it and requeues the job.

    """

    schema: ClassVar[type[EngineConfig]] = EngineConfig
    checkpointable: ClassVar[bool] = False

    def check(self, config: RunConfig, recipe: Any = None) -> list[Problem]:  # noqa: ANN401
        """Its own problems with a validated config, found before anything starts."""
        return []

    def describe(self, config: RunConfig, *, write: bool) -> str:
        """What ``--cfg job`` prints after the config (``write``: what ``--dry-run`` writes)."""
        return ""

    def ray_node(self, config: RunConfig) -> NodeResources | None:
        """What each Ray node of a SLURM job of this run declares; None: it does not use Ray."""
        return None

    def resume_ids(self, config: RunConfig) -> dict[str, str] | None:
        """Tracker run ids of an unfinished earlier run of this exact config, to continue it."""
        return None

    def remember_run_ids(self, config: RunConfig, run_ids: dict[str, str]) -> None:
        """Note the tracker runs this config logs to, as soon as they are open (none here)."""
        return

    def checkpoint(self, config: RunConfig) -> Path | None:
        """The run's checkpoint, if it has one yet."""
        return None

    @abstractmethod
    def run(self, config: RunConfig, recipe: Any, tracker: Any) -> object:  # noqa: ANN401
        """Run the recipe, logging to ``tracker``."""


class PluginEngine(Engine):
    """An object with a ``run`` method, as an :class:`Engine`: its own methods where it has them.

    Args:
        target: the registered object.

    """

    def __init__(self, target: object) -> None:
        if not callable(getattr(target, "run", None)):
            raise TypeError(f"an engine needs a run(config, recipe, tracker) method; {target!r}")
        self.target = target
        self.schema = getattr(target, "schema", EngineConfig)  # type: ignore[misc]
        self.checkpointable = bool(getattr(target, "checkpointable", False))  # type: ignore[misc]

    def check(self, config: RunConfig, recipe: Any = None) -> list[Problem]:  # noqa: ANN401, D102
        own = getattr(self.target, "check", None)
        return list(own(config, recipe)) if callable(own) else []

    def describe(self, config: RunConfig, *, write: bool) -> str:  # noqa: D102
        own = getattr(self.target, "describe", None)
        return own(config, write=write) if callable(own) else ""

    def ray_node(self, config: RunConfig) -> NodeResources | None:  # noqa: D102
        own = getattr(self.target, "ray_node", None)
        return own(config) if callable(own) else None

    def resume_ids(self, config: RunConfig) -> dict[str, str] | None:  # noqa: D102
        own = getattr(self.target, "resume_ids", None)
        return own(config) if callable(own) else None

    def remember_run_ids(self, config: RunConfig, run_ids: dict[str, str]) -> None:  # noqa: D102
        own = getattr(self.target, "remember_run_ids", None)
        if callable(own):
            own(config, run_ids)

    def checkpoint(self, config: RunConfig) -> Path | None:  # noqa: D102
        own = getattr(self.target, "checkpoint", None)
        return own(config) if callable(own) else None

    def run(self, config: RunConfig, recipe: Any, tracker: Any) -> object:  # noqa: ANN401, D102
        return self.target.run(config, recipe, tracker)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"PluginEngine({self.target!r})"


class EngineRegistry(Registry[Engine]):
    """The engines, by ``engine.name``; each one's schema stored in Hydra's ConfigStore."""

    def register(self, name: str, obj: Any = None) -> Any:  # noqa: ANN401 - see Registry
        """Register an engine (an :class:`Engine`, or any object with ``run``) under ``name``.

        Its schema, when it extends ``EngineConfig``, is stored as ``schema/engine_<name>``.

        Raises:
            DuplicateNameError: ``name`` is already registered.
            TypeError: the object has no ``run`` method.

        """
        if obj is None:
            return lambda entry: self.register(name, entry)
        engine = as_engine(obj)
        super().register(name, engine)
        ConfigStore.instance().store(group="schema", name=f"engine_{name}", node=engine.schema)
        return obj


def as_engine(obj: object) -> Engine:
    """``obj`` as an :class:`Engine` (an object with only a ``run`` method gets the defaults)."""
    return obj if isinstance(obj, Engine) else PluginEngine(obj)


def engine_schema(name: str, engines: Registry[Engine]) -> type[EngineConfig]:
    """The schema of the engine ``name`` (EngineConfig when no such engine is registered)."""
    return as_engine(engines.get(name)).schema if name in engines else EngineConfig
