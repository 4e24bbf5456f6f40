"""One view of a data row: what the engines, the rewards and the simulators read from a split row.

    split row (a mapping: pyarrow's ``to_pylist``, pandas' records, verl's ``non_tensor_batch``,
    a dict built in Python; the layout is documented in ``slca_exp/data/rows.py``)
      -> Row(row).prompt()     ``prompt``: the system and user messages the policy is asked
         Row(row).truth()      ``reward_model.ground_truth`` as held: what ``read_gold`` reads
         Row(row).question()   ``ground_truth.question_content``: the user's question
         Row(row).tools()      ``ground_truth.tool_schemas``: the OpenAI function schemas
         Row(row).allowed()    ``ground_truth.allowed_tools``: the tool names the row allows
         Row(row).recorded()   ``extra_info.tool_responses``: what the replay simulator answers
         Row(row).messages()   ``messages``: the gold trajectory of an SFT row

Fields whose shape varies from row to row travel as JSON text, so that one parquet schema fits
every row, but a row built in Python, or read by a reader that decodes, holds them decoded. Every
accessor takes both: a JSON string, or a list, tuple or numpy array (a ground truth: a mapping or
its JSON string); an absent or empty optional field reads as empty. The view only reads:
``slca_exp.data.rows.check_rows`` says whether a row follows the layout, and which field does not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

TRUTH = "reward_model.ground_truth"
TOOLS = f"{TRUTH}.tool_schemas"
RECORDED = "extra_info.tool_responses"
"""Where the fields are, as the errors of the view name them."""


class RowError(ValueError):
    """A field of a row cannot be read (the message names the field)."""


class Row:
    """A read-only view of one split row.

    >>> row = {"prompt": [{"role": "user", "content": "Weather?"}],
    ...        "reward_model": {"ground_truth": {"question_content": "Weather?",
    ...            "tool_schemas": '[{"type": "function", "function": {"name": "weather"}}]'}}}
    >>> Row(row).question(), [t["function"]["name"] for t in Row(row).tools()]
    ('Weather?', ['weather'])
    >>> Row(row).recorded(), Row(row).messages()
    ((), None)

    """

    __slots__ = ("row",)

    def __init__(self, row: Mapping[str, Any]) -> None:
        """View ``row`` (nothing is read until an accessor is called)."""
        self.row = row

    def prompt(self) -> list[Any]:
        """The prompt's messages (``{"role", "content"}``), system first, the question last."""
        return as_list(self.row["prompt"], "prompt")

    def truth(self) -> Any:  # noqa: ANN401 - a mapping or its JSON string, as the row holds it
        """The ground truth as the row holds it: the very object, for ``read_gold``.

        The same object for every call, so that the reward reads a prompt's ground truth once
        for all of its rollouts.

        Raises:
            KeyError: the row has no ``reward_model.ground_truth``.

        """
        return self.row["reward_model"]["ground_truth"]

    def question(self) -> str:
        """The user's question (``""`` when the row does not give one)."""
        return question_of(self.truth())

    def tools(self) -> list[dict[str, Any]]:
        """The row's OpenAI function schemas (``{"type": "function", "function": {...}}``)."""
        held = _truth_mapping(self.truth()).get("tool_schemas")
        return [decoded(s, TOOLS) for s in as_list(held, TOOLS)]  # a schema may be JSON text

    def allowed(self) -> list[str]:
        """The names of the tools the row allows."""
        held = _truth_mapping(self.truth()).get("allowed_tools")
        return [str(name) for name in as_list(held, f"{TRUTH}.allowed_tools")]

    def recorded(self) -> tuple[Any, ...]:
        """The recorded response of each gold call, in order (``{"name", "arguments", "content"}``).

        What the simulators read as ``SimContext.recorded``; ``()`` when the row records none.
        """
        return recorded_of(self._extra().get("tool_responses"))

    def recorded_text(self) -> str:
        """The recorded responses as JSON text: the row's own text as is, ``"[]"`` for none.

        How they travel to verl's tools (``extra_info.tools_kwargs``), one string per row.
        """
        value = self._extra().get("tool_responses")
        if isinstance(value, str) and value.strip():
            return value
        return json.dumps(list(self.recorded()), ensure_ascii=False)

    def messages(self) -> list[Any] | None:
        """The gold trajectory in OpenAI chat format; ``None`` when the row has none.

        Only SFT rows carry one (``slca_exp/data/rows.py``, ``messages``).
        """
        value = self.row.get("messages")
        return None if value is None else as_list(value, "messages")

    def _extra(self) -> Mapping[str, Any]:
        extra = self.row.get("extra_info")
        return extra if isinstance(extra, Mapping) else {}


def question_of(truth: Any) -> str:  # noqa: ANN401
    """The question of a ground truth (a mapping or its JSON string; ``""`` when not given)."""
    return str(_truth_mapping(truth).get("question_content") or "")


def recorded_of(value: Any) -> tuple[Any, ...]:  # noqa: ANN401
    """Recorded tool responses as a row holds them (JSON text or a list) -> a tuple of dicts.

    Mappings become plain dicts; anything else is passed on for the simulator to skip.
    """
    items = as_list(value, RECORDED)
    return tuple(dict(item) if isinstance(item, Mapping) else item for item in items)


def as_list(value: Any, field: str = "field") -> list[Any]:  # noqa: ANN401
    """A list field as a row holds it -> a list; ``None`` and blank text read as ``[]``.

    >>> as_list('[{"a": 1}]') == as_list(({"a": 1},)) == [{"a": 1}] and as_list(None) == []
    True

    Raises:
        RowError: text that is not JSON, or a value that is not a list (``field`` is named).

    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return []
    value = decoded(value, field)
    if not is_list(value):
        raise RowError(f"{field} must be a list, got {type(value).__name__}")
    return list(value)


def decoded(value: Any, field: str = "field") -> Any:  # noqa: ANN401
    """``value`` with JSON text decoded (anything else is returned as is).

    Raises:
        RowError: text that is not JSON (``field`` is named).

    """
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError) as err:
        raise RowError(f"{field} is not valid JSON: {err}") from None


def is_list(value: Any) -> bool:  # noqa: ANN401
    """A list, a tuple or a numpy array (pandas reads parquet lists as arrays)."""
    return isinstance(value, list | tuple) or type(value).__name__ == "ndarray"


def _truth_mapping(truth: Any) -> Mapping[str, Any]:  # noqa: ANN401
    gt = decoded(truth, TRUTH)
    if not isinstance(gt, Mapping):
        raise RowError(f"{TRUTH} must be an object, got {type(gt).__name__}")
    return gt
