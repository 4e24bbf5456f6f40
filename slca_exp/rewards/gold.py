"""A row's ground truth (``reward_model.ground_truth``), read once into a :class:`Gold`.

Rows come from parquet files, JSON files or Python dicts, so every field may arrive as a JSON
string, a list, a tuple or a numpy array. ``gold_tool_calls`` is seen in three shapes in the wild:

- nested: a list of steps, each a list of ``{"name", "arguments"}`` (one step per assistant turn);
  empty steps are dropped;
- flat calls: a list of ``{"name", "arguments"}``, read as a single step;
- flat names: a list of bare tool names (the public Toucan rows), read as a single step of calls
  whose arguments the row does not state.

Only the nested shape says how the calls are grouped into assistant turns (:attr:`Gold.stepped`),
and only a call given with an ``arguments`` (or ``parameters``) object states its arguments
(:attr:`GoldCall.stated`; ``{}`` states that it takes none): what the row does not say, the
strict reward does not judge.

A malformed ground truth is a data bug, not a policy mistake: it raises :class:`GroundTruthError`
naming the field (split loading checks every row up front, so a run never meets one). The ground
truth comes from a row's view (``slca_exp.core.rows.Row.truth``), and its question and JSON text
are read as the view reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import Any

from slca_exp.core.rows import RowError, decoded, is_list, question_of
from slca_exp.rewards.types import ToolCall


class GroundTruthError(ValueError):
    """A row's ``reward_model.ground_truth`` cannot be read."""


@dataclass(frozen=True)
class GoldCall(ToolCall):
    """One gold call, with what the row says about its arguments.

    Attributes:
        stated: the row states the call's arguments (an ``arguments`` or ``parameters`` object,
            ``{}`` included); False for a bare tool name or a call given without arguments.
        keyed: they were given under ``arguments``; the public reward reads no other key, so
            for it a call given with ``parameters`` has none.

    """

    stated: bool = True
    keyed: bool = True

    @property
    def public_arguments(self) -> dict[str, Any]:
        """The arguments as the public reward reads them (``arguments`` only, else ``{}``)."""
        return self.arguments if self.keyed else {}


@dataclass(frozen=True)
class Gold:
    """The parts of a ground truth the rewards use.

    Attributes:
        steps: gold calls per step (assistant turn), in order, empty steps dropped; empty for an
            irrelevant row.
        allowed: the tool names the row allows.
        question: the user's question.
        subset: ``tool_call`` or ``irrelevant`` (as given; empty when absent).
        raw_schemas: ``tool_schemas`` as the row holds it (read on first use of
            :attr:`tool_schemas`: the tool reward never needs them, the simulator does).
        stepped: the row gives its gold calls as steps (nested lists), so it says which calls
            share an assistant turn; a flat list only says which calls are made.

    """

    steps: tuple[tuple[GoldCall, ...], ...]
    allowed: frozenset[str]
    question: str = ""
    subset: str = ""
    raw_schemas: Any = None
    stepped: bool = True

    @cached_property
    def tool_schemas(self) -> dict[str, dict[str, Any]] | None:
        """OpenAI-style function schemas by tool name (``None`` when the row has none)."""
        return _read_schemas(self.raw_schemas)

    @property
    def calls(self) -> list[GoldCall]:
        """Every gold call, steps flattened in order."""
        return [call for step in self.steps for call in step]

    @cached_property
    def stated_calls(self) -> list[GoldCall]:
        """The gold calls whose arguments the row states (strict key / value judge these)."""
        return [call for call in self.calls if call.stated]

    @cached_property
    def argued_calls(self) -> list[ToolCall]:
        """The gold calls with non-empty arguments as the public reward reads them."""
        return [
            ToolCall(call.name, call.public_arguments, call.turn)
            for call in self.calls
            if call.public_arguments
        ]

    @property
    def needs_call(self) -> bool:
        """Whether the row's task needs at least one tool call."""
        return any(self.steps)


def read_gold(ground_truth: Mapping[str, Any] | str | Gold) -> Gold:
    """Read a row's ground truth (a mapping or its JSON string; a :class:`Gold` passes through).

    >>> gold = read_gold({"allowed_tools": ["f"], "gold_tool_calls": ["f"]})
    >>> [(c.name, c.arguments) for c in gold.calls]
    [('f', {})]

    """
    if isinstance(ground_truth, Gold):
        return ground_truth
    gt = _loads(ground_truth, "ground_truth")
    if not isinstance(gt, Mapping):
        raise GroundTruthError(
            f"ground_truth must be an object (or its JSON string), got {type(gt).__name__}"
        )
    allowed = _as_list(gt.get("allowed_tools", []), "allowed_tools")
    if not all(isinstance(name, str) for name in allowed):
        raise GroundTruthError("ground_truth.allowed_tools must be a list of tool names")
    raw = gt.get("gold_tool_calls", [])
    # Rows store the gold calls as a JSON string, identical for the G rollouts of a prompt.
    if isinstance(raw, str):
        steps, stepped = _steps_of_json(raw)
    else:
        steps, stepped = _read_steps(_as_list(raw, "gold_tool_calls"))
    return Gold(
        steps=steps,
        allowed=frozenset(allowed),
        question=question_of(gt),
        subset=str(gt.get("subset_name") or ""),
        raw_schemas=gt.get("tool_schemas"),
        stepped=stepped,
    )


Steps = tuple[tuple[GoldCall, ...], ...]


@lru_cache(maxsize=4096)
def _steps_of_json(raw: str) -> tuple[Steps, bool]:
    return _read_steps(_as_list(raw, "gold_tool_calls"))


def _read_steps(items: list[Any]) -> tuple[Steps, bool]:
    """The non-empty steps, and whether the row gave steps (nested lists) at all."""
    if not items:
        return (), False
    if all(is_list(item) for item in items):
        steps = [
            tuple(_read_call(c, f"gold_tool_calls[{i}][{j}]", 0) for j, c in enumerate(step))
            for i, step in enumerate(map(list, items))
        ]
        # Empty steps are dropped (the public reward does too); turns count the others.
        kept = (step for step in steps if step)
        return tuple(tuple(replace(c, turn=t) for c in step) for t, step in enumerate(kept)), True
    if any(is_list(item) for item in items):
        raise GroundTruthError(
            "ground_truth.gold_tool_calls mixes steps (lists) and calls; use one shape"
        )
    return (tuple(_read_call(c, f"gold_tool_calls[{j}]", 0) for j, c in enumerate(items)),), False


def _read_call(item: Any, where: str, turn: int) -> GoldCall:  # noqa: ANN401
    if isinstance(item, str):
        return GoldCall(item, {}, turn, stated=False, keyed=False)
    if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
        raise GroundTruthError(f"ground_truth.{where} must be a tool name or {{name, arguments}}")
    keyed = item.get("arguments") is not None
    args = item["arguments"] if keyed else item.get("parameters")
    if args is None:  # no arguments given: the row does not say what they are
        return GoldCall(item["name"], {}, turn, stated=False, keyed=False)
    args = _loads(args, f"{where}.arguments")
    if not isinstance(args, Mapping):
        raise GroundTruthError(f"ground_truth.{where}.arguments must be an object")
    return GoldCall(item["name"], dict(args), turn, stated=True, keyed=keyed)


def _read_schemas(raw: Any) -> dict[str, dict[str, Any]] | None:  # noqa: ANN401
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    schemas = _as_list(raw, "tool_schemas")
    out = {}
    for schema in schemas:
        schema = _loads(schema, "tool_schemas[]")
        fn = schema.get("function", schema) if isinstance(schema, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise GroundTruthError(
                "ground_truth.tool_schemas must be OpenAI-style function schemas with a name"
            )
        out[fn["name"]] = dict(fn)
    return out


def _loads(value: Any, where: str) -> Any:  # noqa: ANN401
    try:
        return decoded(value, f"ground_truth.{where}")
    except RowError as err:
        raise GroundTruthError(str(err)) from None


def _as_list(value: Any, where: str) -> list[Any]:  # noqa: ANN401
    value = _loads(value, where)
    if value is None:
        return []
    if not is_list(value):
        raise GroundTruthError(f"ground_truth.{where} must be a list, got {type(value).__name__}")
    return list(value)
