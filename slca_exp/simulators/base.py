"""The simulator protocol: a tool call in, the tool's response out.

During a rollout the policy writes ``<tool_call>`` blocks; the environment answers each with a
simulated tool response (injected with mask 0). A simulator never raises on a call: schema
violations come back as ``status="schema_error"`` and an error the policy reads, and a service
that cannot answer after its retries gives ``status="failed"`` with a JSON error content.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from slca_exp.core import names
from slca_exp.rewards.types import ToolCall
from slca_exp.services.backend import Backend, Counted

STATUSES = ("ok", "schema_error", "failed")

UNAVAILABLE = json.dumps({"error": "tool unavailable"})
"""What the policy reads when the simulator service failed."""


@dataclass(frozen=True)
class SimContext:
    """What the simulator may know beyond the call.

    Attributes:
        question: the user's question of the row.
        recorded: the row's recorded tool responses, each ``{"name", "arguments", "content"}``.

    """

    question: str = ""
    recorded: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class SimRequest:
    """One call to simulate: the call, the tool's OpenAI-style schema (or None), the context."""

    call: ToolCall
    schema: dict[str, Any] | None = None
    context: SimContext = SimContext()


@dataclass(frozen=True)
class ToolResponse:
    """The simulated tool response.

    Attributes:
        content: what the policy reads inside ``<tool_response>``.
        status: ``ok`` | ``schema_error`` (arguments contradict the schema; no model was asked)
            | ``failed`` (the service could not answer; content is a JSON error).
        reason: how it was produced or why it failed (``recorded``, ``derived``, ``HTTP 500 after
            4 attempts``, ...); never contains a secret.
        cached: answered from the persistent cache.
        latency_ms: time spent on the service (0 for cache hits and local answers).

    """

    content: str
    status: str
    reason: str = ""
    cached: bool = False
    latency_ms: float = 0.0


def batch_stats(responses: Sequence[ToolResponse]) -> dict[str, float]:
    """The simulator metrics of one batch, named as in ``core/names.py``.

    ``simulator/requests`` counts the calls that passed the schema check (the simulator was
    asked), ``simulator/failures`` the failed responses; ``simulator/cache_hit_frac`` is the
    fraction of the checked calls answered from the cache (0.0 when there were none).
    """
    checked = [r for r in responses if r.status != "schema_error"]
    return {
        names.SIMULATOR_REQUESTS: float(len(checked)),
        names.SIMULATOR_FAILURES: float(sum(r.status == "failed" for r in responses)),
        names.SIMULATOR_CACHE_HIT_FRAC: (
            sum(r.cached for r in checked) / len(checked) if checked else 0.0
        ),
    }


@runtime_checkable
class Simulator(Protocol):
    """What every simulator provides; build one with ``slca_exp.simulators.build_simulator``."""

    name: str

    def respond(
        self, call: ToolCall, schema: dict[str, Any] | None, context: SimContext
    ) -> ToolResponse:
        """Simulate one call."""
        ...

    async def arespond_batch(self, requests: Sequence[SimRequest]) -> list[ToolResponse]:
        """Simulate a batch concurrently (awaitable from any event loop), in request order."""
        ...

    def respond_batch(self, requests: Sequence[SimRequest]) -> list[ToolResponse]:
        """Simulate a batch, blocking; works whether or not the calling thread runs a loop."""
        ...

    def describe(self) -> dict[str, Any]:
        """The recipe fields of this simulator (backend, model, prompt hash, decoding)."""
        ...

    def close(self) -> None:
        """Release connections and files (idempotent)."""
        ...


class SimulatorBase(Counted, Backend):
    """Shared plumbing: ``respond`` over ``respond_batch``, counters, context manager.

    A simulator backend is a subclass registered in ``slca_exp.simulators.SIMULATORS`` under the
    name ``simulator.backend`` picks; ``cls(cfg)`` builds it from the ``simulator`` config.
    """

    STATUS_COUNTERS = {"schema_error": "schema_errors", "failed": "failures"}
    remote: bool = False
    """Whether the simulator asks a server: then validation requires ``simulator.model`` and
    ``simulator.base_url``, and ``validate`` / ``--dry-run`` probe that URL (unless
    ``--offline``)."""

    def __init__(self, cfg: Any) -> None:  # noqa: ANN401
        super().__init__()
        self.cfg = cfg

    def respond(
        self, call: ToolCall, schema: dict[str, Any] | None, context: SimContext | None = None
    ) -> ToolResponse:
        """Simulate one call (see :meth:`respond_batch`)."""
        return self.respond_batch([SimRequest(call, schema, context or SimContext())])[0]

    @abstractmethod
    def respond_batch(self, requests: Sequence[SimRequest]) -> list[ToolResponse]:
        """Simulate a batch, blocking."""

    async def arespond_batch(self, requests: Sequence[SimRequest]) -> list[ToolResponse]:
        """Simulate a batch; local simulators compute it directly."""
        return self.respond_batch(requests)

    def stats(self) -> dict[str, float]:
        """Counters since construction: requests, schema_errors, cache_hits, failures."""
        return {k: float(v) for k, v in self._counts.items()}


def check_fields(cfg: Any) -> dict[str, bool]:  # noqa: ANN401
    """The schema-check switches as recorded in the recipe."""
    return {
        "check_required_args": bool(cfg.check_required_args),
        "check_types": bool(cfg.check_types),
        "schema_guidance": guided(cfg),
    }


def guided(cfg: Any) -> bool:  # noqa: ANN401
    """Whether the simulator is given the called tool's schema (``simulator.schema_guidance``)."""
    return bool(cfg.schema_guidance)


def argument_checks(cfg: Any) -> dict[str, bool]:  # noqa: ANN401
    """``check_call``'s switches: the required and type checks, both off without guidance.

    A call of a tool the row does not offer is refused either way: the engines offer a rollout
    only its row's tools.
    """
    on = guided(cfg)
    return {"required": on and bool(cfg.check_required_args), "types": on and bool(cfg.check_types)}
