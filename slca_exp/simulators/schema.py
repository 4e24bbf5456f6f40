"""Checking a tool call's arguments against its OpenAI-style function schema, without a model.

SGLS (the paper's simulator) checks the required parameters against the schema before the simulator
model is asked; we also check JSON types (``integer`` vs ``number`` included), ``enum`` values,
nested objects and arrays, and ``additionalProperties: false``. A violation becomes a tool error
response the policy reads, so a malformed call costs no request and cannot be papered over by an
obliging model.

A schema is ``{"type": "function", "function": {"name", "parameters"}}`` or the inner
``{"name", "parameters"}``; ``parameters`` is a JSON-schema object.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from slca_exp.rewards.types import ToolCall

MAX_ERRORS = 20
MAX_DEPTH = 32  # deeper values are not checked (a schema that deep is not a tool schema)

_JSON_TYPE = {bool: "boolean", str: "string", int: "integer", float: "number", type(None): "null"}


def function_of(schema: Any) -> dict[str, Any] | None:  # noqa: ANN401
    """The function part of a schema (``{"name", "parameters", ...}``), or ``None``."""
    if not isinstance(schema, dict):
        return None
    inner = schema.get("function")
    fn = inner if isinstance(inner, dict) else schema
    return fn if isinstance(fn.get("name"), str) else None


def find_schema(name: str, schemas: Iterable[Any] | str | None) -> dict[str, Any] | None:
    """The schema named ``name`` in a list of schemas (or its JSON text, as rows store it)."""
    if isinstance(schemas, str):
        try:
            schemas = json.loads(schemas)
        except (ValueError, RecursionError):
            return None
    if not isinstance(schemas, list):
        return None
    for schema in schemas:
        fn = function_of(schema)
        if fn is not None and fn["name"] == name:
            return schema
    return None


def check_call(
    call: ToolCall,
    schema: dict[str, Any] | None,
    *,
    required: bool = True,
    types: bool = True,
) -> list[str]:
    """Every way ``call`` contradicts ``schema`` (empty when it conforms), at most 20.

    Args:
        call: the call.
        schema: its tool's schema; ``None`` (or a schema of another name) means an unknown tool.
        required: check required parameters (config ``simulator.check_required_args``).
        types: check types, enums and unknown parameters (config ``simulator.check_types``).

    >>> schema = {"name": "weather", "parameters": {"type": "object", "required": ["city"],
    ...     "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}
    >>> check_call(ToolCall("weather", {"days": 2.5}), schema)
    ["missing required parameter 'city'", "parameter 'days' must be integer (got number)"]

    """
    fn = function_of(schema)
    if fn is None or fn["name"] != call.name:
        return [f"unknown tool {call.name!r}"]
    params = fn.get("parameters")
    if not isinstance(params, dict):
        params = {}
    args = call.arguments if isinstance(call.arguments, dict) else {}
    errors: list[str] = []
    if not isinstance(call.arguments, dict):
        errors.append("arguments must be a JSON object")
    if required or types:
        _check_object(args, params, "", errors, 0, required=required, types=types)
    return errors[:MAX_ERRORS]


def error_content(call: ToolCall, errors: list[str]) -> str:
    """The tool response the policy reads for a call that failed the schema check."""
    unknown = len(errors) == 1 and errors[0].startswith("unknown tool")
    message = errors[0] if unknown else f"invalid arguments for tool {call.name!r}"
    body: dict[str, Any] = {"error": message}
    if not unknown:
        body["details"] = errors
    return json.dumps(body, ensure_ascii=False)


def _check_object(
    value: dict[str, Any],
    schema: dict[str, Any],
    path: str,
    errors: list[str],
    depth: int,
    *,
    required: bool,
    types: bool,
) -> None:
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    if required:
        needed = schema.get("required")
        for name in needed if isinstance(needed, list) else []:
            if isinstance(name, str) and name not in value:
                errors.append(f"missing required parameter {path + name!r}")
    if not types:
        return
    for name, item in value.items():
        sub = props.get(name)
        if isinstance(sub, dict):
            _check_value(item, sub, f"{path}{name}", errors, depth + 1, required=required)
        elif schema.get("additionalProperties") is False:
            errors.append(f"unknown parameter {path + str(name)!r}")
        if len(errors) >= MAX_ERRORS:
            return


def _check_value(
    value: Any,  # noqa: ANN401
    schema: dict[str, Any],
    path: str,
    errors: list[str],
    depth: int,
    *,
    required: bool,
) -> None:
    if depth > MAX_DEPTH:
        return
    expected = schema.get("type")
    allowed = [expected] if isinstance(expected, str) else expected
    if isinstance(allowed, list) and allowed and not any(_is(value, t) for t in allowed):
        want = " or ".join(str(t) for t in allowed)
        errors.append(f"parameter {path!r} must be {want} (got {_type_name(value)})")
        return
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and not any(_same(value, e) for e in enum):
        shown = json.dumps(enum, ensure_ascii=False)[:200]
        errors.append(f"parameter {path!r} must be one of {shown} (got {_short(value)})")
        return
    if isinstance(value, dict):
        _check_object(value, schema, f"{path}.", errors, depth, required=required, types=True)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value[:1000]):
            _check_value(
                item, schema["items"], f"{path}[{i}]", errors, depth + 1, required=required
            )
            if len(errors) >= MAX_ERRORS:
                return


def _is(value: Any, json_type: Any) -> bool:  # noqa: ANN401
    if json_type == "integer":
        if isinstance(value, float):  # JSON 3.0 is an integer (JSON Schema draft 6+)
            return math.isfinite(value) and value.is_integer()
        return isinstance(value, int) and not isinstance(value, bool)
    if json_type == "number":
        if isinstance(value, float):
            return math.isfinite(value)  # NaN / Infinity are not JSON numbers
        return isinstance(value, int) and not isinstance(value, bool)
    checks = {
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
        "null": lambda v: v is None,
    }
    check = checks.get(json_type) if isinstance(json_type, str) else None
    return True if check is None else check(value)  # unknown type names constrain nothing


def _same(value: Any, option: Any) -> bool:  # noqa: ANN401
    # 1 == True in Python, not in JSON.
    return isinstance(value, bool) == isinstance(option, bool) and value == option


def _type_name(value: Any) -> str:  # noqa: ANN401
    if isinstance(value, float) and not math.isfinite(value):
        return "non-finite number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return _JSON_TYPE.get(type(value), type(value).__name__)


def _short(value: Any) -> str:  # noqa: ANN401
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
