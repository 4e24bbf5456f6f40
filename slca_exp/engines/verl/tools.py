"""The simulator as verl tools: every tool call of a rollout answered by slca-exp's simulator.

verl's multi-turn ``ToolAgentLoop`` parses the hermes ``<tool_call>`` blocks of a turn and calls
the ``BaseTool`` registered under each call's name, listed in a tool-config YAML
(``actor_rollout_ref.rollout.multi_turn.tool_config_path``):

    split rows -> their tool schemas (``reward_model.ground_truth.tool_schemas``), one per name
    -> :func:`tool_config`: one ``SimulatedTool`` entry per tool, with the simulator config
    -> verl's ``initialize_tools_from_config`` builds them in every rollout worker
    -> per row, its own tools in its own order (:func:`tool_selection`, which verl's loop reads
       from ``extra_info.tool_selection``): the prompt lists them as the local engine's does,
       and a call of any other tool is refused by verl's loop, as the local engine refuses it
    -> per call: ``create(create_kwargs=...)`` with the row's context (:func:`tools_kwargs`:
       the question and the recorded responses, which verl's dataset reads from
       ``extra_info.tools_kwargs``) -> ``execute`` -> our simulator (replay or SGLS, with its
       schema check and cache) -> ``release``
    -> each answer's status counted in the rollout's ``extra_fields`` (:data:`SIM_REQUESTS_KEY`,
       :data:`SIM_FAILURES_KEY`): slca-exp's trainer turns them into ``simulator/*`` metrics

The simulator is built once per worker process and shared by the tools of that process.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from uuid import uuid4

from omegaconf import OmegaConf

from slca_exp.config.services import SimulatorConfig
from slca_exp.core import names
from slca_exp.core.rows import Row, recorded_of
from slca_exp.engines.verl.rollouts import record_answer
from slca_exp.rewards.types import ToolCall
from slca_exp.simulators import SimContext, Simulator, build_simulator

SIM_REQUESTS_KEY = "slca/simulator/requests"
"""A rollout's tool calls the simulator was asked to answer (the schema check passed)."""
SIM_FAILURES_KEY = "slca/simulator/failures"
"""Those it could not answer after its retries."""
TOOL_CLASS = "slca_exp.engines.verl.tools.SimulatedTool"
"""What the tool config names as ``class_name`` (verl imports it by this path)."""

try:  # verl is an extra: the config can be written without it, the tools need it
    from verl.tools.base_tool import BaseTool as _ToolBase
    from verl.tools.schemas import ToolResponse as _VerlToolResponse
except ImportError:  # pragma: no cover - exercised only without the verl extra
    _ToolBase = object
    _VerlToolResponse = None


class ToolConfigError(ValueError):
    """The split's tool schemas cannot make one tool config (the message names the tool)."""


def schemas_of(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The distinct OpenAI function schemas of ``rows``, sorted by tool name.

    Raises:
        ToolConfigError: two rows describe one tool name differently (the tool is named).

    """
    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        for schema in Row(row).tools():
            name = schema["function"]["name"]
            if name in found and found[name] != schema:
                raise ToolConfigError(
                    f"tool {name!r} has two different schemas in the split (row "
                    f"{row.get('extra_info', {}).get('index', '?')}); a verl tool config holds "
                    "one schema per name: make them agree"
                )
            found[name] = schema
    return [found[name] for name in sorted(found)]


def tool_config(schemas: Iterable[Mapping[str, Any]], simulator: Any) -> dict[str, Any]:  # noqa: ANN401
    """The verl tool config (``{"tools": [...]}``) of ``schemas``, answered by ``simulator``.

    Args:
        schemas: OpenAI function schemas (``{"type": "function", "function": {...}}``).
        simulator: the run's ``simulator`` config (``SimulatorConfig`` or a mapping of it).

    """
    sim = _as_dict(simulator)
    return {
        "tools": [
            {
                "class_name": TOOL_CLASS,
                "config": {"type": "native", "simulator": sim},
                "tool_schema": _verl_schema(schema),
            }
            for schema in schemas
        ]
    }


def write_tool_config(
    path: str | Path,
    rows: Iterable[Mapping[str, Any]],
    simulator: Any,  # noqa: ANN401
) -> Path:
    """Write the tool config of the split ``rows`` to ``path`` (YAML); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    config = OmegaConf.create(tool_config(schemas_of(rows), simulator))
    path.write_text(OmegaConf.to_yaml(config))
    return path


def tools_kwargs(row: Mapping[str, Any], tool_names: Iterable[str] | None = None) -> dict[str, Any]:
    """``extra_info.tools_kwargs`` of ``row``: each tool gets the row's context.

    Args:
        row: a split row.
        tool_names: the tools to list (default: the ones the row allows).

    """
    view = Row(row)
    context = {"question": view.question(), "tool_responses": view.recorded_text()}
    names = view.allowed() if tool_names is None else sorted(tool_names)
    return {name: {"create_kwargs": dict(context)} for name in names}


def tool_selection(row: Mapping[str, Any]) -> list[str]:
    """The names of the row's own tool schemas, in the row's order (``extra_info.tool_selection``).

    verl's tool agent loop shows the prompt only these tools, in this order, and answers calls
    of these only (any other name gets verl's unknown-function message), as the local engine
    renders and answers a row's ``tool_schemas``. Without it every prompt would list every tool
    of the split, sorted by name. An empty list (a row without schemas) is read by verl as
    "every tool".
    """
    return [str(schema["function"]["name"]) for schema in Row(row).tools()]


def verl_rows(rows: Iterable[Mapping[str, Any]], tool_names: Iterable[str]) -> list[dict[str, Any]]:
    """``rows`` as verl's dataset reads them: ``extra_info.tools_kwargs`` and ``tool_selection``.

    Every row names every tool of ``tool_names`` (the split's) in its ``tools_kwargs``, each with
    the row's context, so one parquet schema fits all rows; ``tool_selection`` (the row's own
    tools, :func:`tool_selection`) decides which of them its prompt lists and its calls reach.
    """
    names = sorted(tool_names)
    return [
        {
            **row,
            "extra_info": {
                **(row.get("extra_info") or {}),
                "tools_kwargs": tools_kwargs(row, names),
                "tool_selection": tool_selection(row),
            },
        }
        for row in rows
    ]


def write_verl_split(
    rows: Iterable[Mapping[str, Any]], tool_names: Iterable[str], path: str | Path
) -> Path:
    """Write :func:`verl_rows` of ``rows`` as parquet to ``path``; returns the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.Table.from_pylist(verl_rows(rows, tool_names)), tmp)
    tmp.replace(path)  # a reader never sees half a file
    return path


class SimulatedTool(_ToolBase):  # type: ignore[misc, valid-type]
    """A verl ``BaseTool`` whose every call is answered by slca-exp's simulator."""

    _simulators: dict[str, Simulator] = {}  # noqa: RUF012 - one per config, per process

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:  # noqa: ANN401
        super().__init__(config, tool_schema)
        key = json.dumps(config.get("simulator") or {}, sort_keys=True)
        if key not in SimulatedTool._simulators:
            SimulatedTool._simulators[key] = build_simulator(_simulator_config(config))
        self.simulator = SimulatedTool._simulators[key]
        self.schema = tool_schema.model_dump(exclude_none=True) if tool_schema else None
        self._contexts: dict[str, SimContext] = {}

    async def create(
        self,
        instance_id: str | None = None,
        create_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,  # noqa: ANN401
    ) -> tuple[str, Any]:
        """Open a call: remember the row's context (question, recorded responses)."""
        instance_id = instance_id or str(uuid4())
        given = dict(create_kwargs or {})
        self._contexts[instance_id] = SimContext(
            str(given.get("question") or ""), recorded_of(given.get("tool_responses"))
        )
        return instance_id, _VerlToolResponse()

    async def execute(
        self,
        instance_id: str,
        parameters: dict[str, Any],
        **kwargs: Any,  # noqa: ANN401
    ) -> tuple[Any, float, dict[str, Any]]:
        """Answer the call with the simulator; its status travels in the metrics."""
        context = self._contexts.get(instance_id, SimContext())
        call = ToolCall(self.name, dict(parameters))
        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(
            None, lambda: self.simulator.respond(call, self.schema, context)
        )
        metrics = {
            "status": answer.status,
            "reason": answer.reason,
            "cached": answer.cached,
            "latency_ms": answer.latency_ms,
        }
        fields = getattr(kwargs.get("agent_data"), "extra_fields", None)
        count_answer(fields, answer.status)
        record_answer(fields, self.name, parameters, answer)  # shown with the logged rollouts
        return _VerlToolResponse(text=answer.content), 0.0, metrics

    async def release(self, instance_id: str, **kwargs: Any) -> None:  # noqa: ANN401
        """Close the call."""
        self._contexts.pop(instance_id, None)


def count_answer(extra_fields: dict[str, Any] | None, status: str) -> None:
    """Count one simulator answer in a rollout's ``extra_fields`` (verl's agent data).

    verl's loop hands each tool call its rollout's ``agent_data``, whose ``extra_fields`` travel
    with the rollout to the trainer; a call that failed the schema check never reached the
    simulator and is not a request.
    """
    if extra_fields is None or status == "schema_error":
        return
    extra_fields[SIM_REQUESTS_KEY] = int(extra_fields.get(SIM_REQUESTS_KEY, 0)) + 1
    failed = int(status == "failed")
    extra_fields[SIM_FAILURES_KEY] = int(extra_fields.get(SIM_FAILURES_KEY, 0)) + failed


def simulator_metrics(extra_fields: Iterable[Any]) -> dict[str, float]:
    """``simulator/requests`` and ``simulator/failures`` of a step, from its rollouts' fields.

    {} when no rollout carries the counts (no tool was called, or another tool answered).
    """
    rows = [f for f in extra_fields if isinstance(f, Mapping) and SIM_REQUESTS_KEY in f]
    if not rows:
        return {}
    return {
        names.SIMULATOR_REQUESTS: float(sum(int(f[SIM_REQUESTS_KEY]) for f in rows)),
        names.SIMULATOR_FAILURES: float(sum(int(f.get(SIM_FAILURES_KEY, 0)) for f in rows)),
    }


def _simulator_config(config: Mapping[str, Any]) -> SimulatorConfig:
    merged = OmegaConf.merge(OmegaConf.structured(SimulatorConfig), config.get("simulator") or {})
    return OmegaConf.to_object(merged)


def _as_dict(simulator: Any) -> dict[str, Any]:  # noqa: ANN401
    if isinstance(simulator, Mapping):
        return dict(simulator)
    return OmegaConf.to_container(OmegaConf.structured(simulator), resolve=True)


def _verl_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema as verl's pydantic models read it (a description is required there)."""
    function = dict(schema["function"])
    function.setdefault("description", function["name"])
    params = dict(function.get("parameters") or {"type": "object", "properties": {}})
    params.setdefault("properties", {})
    function["parameters"] = params
    return {"type": schema.get("type", "function"), "function": function}
