"""The replay simulator (registry name ``replay``): deterministic, no model, CPU.

1. A recorded response of the row whose tool name equals the call's and whose arguments have
   the same keys with loosely equal values (HierR's rule, ``rewards.match.loose_equal``) is
   returned as recorded (reason ``recorded``).
2. Otherwise, when the tool's schema is given, the call is checked against it
   (``simulators.schema``; its arguments only under ``simulator.schema_guidance``); a violation
   is a ``schema_error`` response.
3. Otherwise a response is derived from the call (reason ``derived``): a JSON result object with
   a few typed fields drawn from a sha256 of the tool name and the canonical JSON of the
   arguments. The same call gives the same bytes in every process and on every machine
   (Python's ``hash()`` is salted per process, so it is never used).

Without a schema, a call is never refused: rows that carry no schemas still replay.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

from slca_exp.rewards.match import loose_equal
from slca_exp.rewards.types import ToolCall
from slca_exp.services.cache import cache_key, canonical_json
from slca_exp.simulators.base import (
    SimRequest,
    SimulatorBase,
    ToolResponse,
    argument_checks,
    check_fields,
)
from slca_exp.simulators.schema import check_call, error_content

REPLAY_VERSION = "replay-v2"

_NOUNS = ("record", "entry", "result", "item", "match")
_STATES = ("active", "available", "confirmed", "pending", "updated")
_RULE = {"replay": REPLAY_VERSION, "nouns": _NOUNS}
"""The replay rule as recorded: its hash is the simulator's ``prompt_sha256``."""


def arguments_match(given: Any, recorded: Any) -> bool:  # noqa: ANN401
    """Same argument names, every value loosely equal."""
    if not isinstance(given, dict) or not isinstance(recorded, dict):
        return False
    return given.keys() == recorded.keys() and all(
        loose_equal(v, recorded[k]) for k, v in given.items()
    )


def derived_response(call: ToolCall) -> str:
    """The deterministic JSON response for a call with no recorded answer.

    >>> a = derived_response(ToolCall("lookup", {"id": 7}))
    >>> a == derived_response(ToolCall("lookup", {"id": 7})), json.loads(a)["status"]
    (True, 'success')

    """
    try:
        seed = canonical_json([call.name, call.arguments])
    except (ValueError, RecursionError):  # circular or absurdly deep arguments
        seed = canonical_json([call.name, "unserialisable arguments"])
    digest = hashlib.sha256(seed.encode("utf-8", "surrogatepass")).digest()
    draw = _Draws(digest)
    # Short on purpose: a small policy reads it back within its response budget.
    noun = _NOUNS[draw.below(len(_NOUNS))]
    result = {
        "tool": call.name,
        "status": "success",
        "result": {
            "id": f"{noun[:3]}-{draw.hex(6)}",
            "value": round(draw.unit() * 1000, 2),
            "state": _STATES[draw.below(len(_STATES))],
        },
    }
    return json.dumps(result, ensure_ascii=False, sort_keys=True)


class ReplaySimulator(SimulatorBase):
    """Recorded responses, else schema check, else a derived response (see module docstring)."""

    name = "replay"
    remote = False

    def respond_batch(self, requests: Sequence[SimRequest]) -> list[ToolResponse]:
        """Answer each request; never raises on any call."""
        return self._count([self._one(r) for r in requests])

    def _one(self, request: SimRequest) -> ToolResponse:
        call = request.call
        for item in request.context.recorded:
            if (
                isinstance(item, dict)
                and item.get("name") == call.name
                and arguments_match(call.arguments, item.get("arguments"))
            ):
                content = item.get("content")
                text = content if isinstance(content, str) else canonical_json(content)
                return ToolResponse(text, "ok", "recorded")
        if request.schema is not None:
            errors = check_call(call, request.schema, **argument_checks(self.cfg))
            if errors:
                return ToolResponse(error_content(call, errors), "schema_error", "; ".join(errors))
        return ToolResponse(derived_response(call), "ok", "derived")

    @classmethod
    def describe_config(cls, cfg: Any) -> dict[str, Any]:  # noqa: ANN401
        """Backend and replay-rule version (no model, no sampling)."""
        return {
            "backend": "replay",
            "name": cfg.name,
            "model": None,
            "prompt_version": REPLAY_VERSION,
            "prompt_sha256": cache_key(_RULE),
            "temperature": None,
            "max_tokens": None,
            **check_fields(cfg),
        }

    @classmethod
    def prompt_text(cls, cfg: Any) -> str:  # noqa: ANN401
        """The rule's version and word list as canonical JSON (what ``prompt_sha256`` hashes)."""
        return canonical_json(_RULE)


class _Draws:
    """Deterministic draws from a digest: block k is sha256(seed || k)."""

    def __init__(self, seed: bytes) -> None:
        self.seed, self.counter = seed, 0

    def _next(self) -> bytes:
        self.counter += 1
        return hashlib.sha256(self.seed + self.counter.to_bytes(8, "big")).digest()

    def below(self, n: int) -> int:
        return int.from_bytes(self._next()[:8], "big") % n

    def unit(self) -> float:
        return int.from_bytes(self._next()[:7], "big") / float(1 << 56)

    def hex(self, n: int) -> str:
        return self._next().hex()[:n]


def _json_safe(v: Any, depth: int = 0) -> Any:  # noqa: ANN401
    """``v`` with non-finite floats as strings, so the content is strict JSON."""
    if depth > 64:
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {str(k): _json_safe(x, depth + 1) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_safe(x, depth + 1) for x in v]
    return v
