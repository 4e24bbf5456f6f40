"""Tool simulators: deterministic replay and the schema-guided LLM simulator (SGLS).

Build one from the ``simulator`` config with :func:`build_simulator`; :func:`describe_simulator`
gives the fields the recipe records without building anything (no network, no cache file).

Example:
    >>> from slca_exp.config.services import SimulatorConfig
    >>> from slca_exp.rewards.types import ToolCall
    >>> sim = build_simulator(SimulatorConfig())
    >>> recorded = ({"name": "weather", "arguments": {"city": "Paris"}, "content": "21 C"},)
    >>> sim.respond(ToolCall("weather", {"city": " paris"}), None, SimContext("", recorded))
    ToolResponse(content='21 C', status='ok', reason='recorded', cached=False, latency_ms=0.0)

"""

from __future__ import annotations

from typing import Any

from slca_exp.registry import Registry
from slca_exp.simulators.base import (
    SimContext,
    SimRequest,
    Simulator,
    SimulatorBase,
    ToolResponse,
    batch_stats,
)
from slca_exp.simulators.replay import ReplaySimulator, derived_response, loose_equal
from slca_exp.simulators.schema import check_call, find_schema
from slca_exp.simulators.sgls import SGLSSimulator

SIMULATORS: Registry[type[SimulatorBase]] = Registry("simulator")
"""Simulator backends, keyed by ``simulator.backend``: ``SimulatorBase`` subclasses, ``cls(cfg)``
builds one from a ``simulator`` config and ``cls.remote`` says whether it asks a server. Plugins
(``SLCA_EXP_PLUGINS``) register their own."""
SIMULATORS.register("replay", ReplaySimulator)
SIMULATORS.register("sgls", SGLSSimulator)


def build_simulator(cfg: Any) -> Simulator:  # noqa: ANN401
    """The simulator a ``simulator`` config describes (``cfg.backend`` picks the entry).

    Raises:
        UnknownNameError: no simulator is registered under ``cfg.backend``.
        FileNotFoundError: ``simulator.prompt`` names no template.

    """
    return SIMULATORS.get(cfg.backend)(cfg)


def describe_simulator(cfg: Any) -> dict[str, Any]:  # noqa: ANN401
    """The recipe fields of the simulator ``cfg`` describes (cheap: no network, no cache)."""
    return SIMULATORS.get(cfg.backend).describe_config(cfg)


__all__ = [
    "SIMULATORS",
    "ReplaySimulator",
    "SGLSSimulator",
    "SimContext",
    "SimRequest",
    "Simulator",
    "ToolResponse",
    "batch_stats",
    "build_simulator",
    "check_call",
    "derived_response",
    "describe_simulator",
    "find_schema",
    "loose_equal",
]
