"""The SFT split as verl's multi-turn SFT dataset reads it, and that dataset.

verl's ``MultiTurnSFTDataset`` reads parquet with pandas' pyarrow backend, and parquet gives
every row of a column one struct type: tool arguments and tool schemas, whose keys differ from
tool to tool, come back as the union of all keys with ``None`` for the missing ones (the chat
template then renders ``"city": null`` for every other tool's parameters), or fail to write when
two tools give one key different types. :func:`write_sft_data` therefore stores each row's
messages and tools as JSON text, and the SFT config names :data:`DATASET_CLASS` here (verl's
``data.custom_cls``): verl's own dataset with one change, it decodes the two columns when a row
is read. Tokenization, the per-turn loss mask and truncation are verl's.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slca_exp.core.problems import Problem
from slca_exp.core.rows import Row, decoded

DATASET_CLASS = "JSONChatSFTDataset"
"""The dataset class verl's SFT trainer loads from this module (``data.custom_cls.name``)."""
MESSAGES, TOOLS = "messages", "tools"


def write_sft_data(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write SFT rows in the layout :data:`DATASET_CLASS` (verl's dataset) reads.

    One parquet row per trajectory with two JSON columns: ``messages``, the OpenAI-format chat
    as HF chat templates take it (``content`` a string, each ``tool_calls`` entry
    ``{"type": "function", "function": {"name", "arguments": {...}}}`` with the arguments an
    object, never JSON text), and ``tools``, the row's OpenAI function schemas.

    Args:
        rows: rows of our SFT split (``slca_exp/data/rows.py``: ``messages`` and
            ``reward_model.ground_truth.tool_schemas``).
        path: the parquet file to write (its folder is created).

    Returns:
        ``path``.

    Raises:
        DataError: rows without a readable chat or schemas (each listed with its index).

    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from slca_exp.data.splits import DataError

    out, bad = {MESSAGES: [], TOOLS: []}, []
    for i, row in enumerate(map(Row, rows)):
        try:
            messages, tools = chat_messages(row.messages()), _tools_of(row)
        except (KeyError, TypeError, ValueError) as err:
            bad.append(f"row {i}: {type(err).__name__}: {err}")
            continue
        out[MESSAGES].append(json.dumps(messages, ensure_ascii=False))
        out[TOOLS].append(json.dumps(tools, ensure_ascii=False))
    if bad or not out[MESSAGES]:
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise DataError(
            [
                Problem(
                    "data.files.sft",
                    f"{len(bad)} of {len(rows)} SFT rows cannot be trained on: {shown}"
                    if bad
                    else "the SFT split has no rows",
                    "give every row a messages chat (slca_exp/data/rows.py) and tool_schemas",
                )
            ]
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table(out, schema=pa.schema([(MESSAGES, pa.string()), (TOOLS, pa.string())])), path
    )
    return path


def chat_messages(messages: str | Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """A chat (a JSON string or a list) as HF chat templates take it.

    ``content`` becomes a string (``None``: empty), every tool call
    ``{"type": "function", "function": {"name", "arguments": {...}}}`` (arguments given as JSON
    text, as the OpenAI API sends them, are decoded).

    Raises:
        ValueError: not a list of messages, an unknown role, or arguments that are no object.

    """
    from slca_exp.data.rows import ROLES

    messages = decoded(messages, MESSAGES)
    if not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages is not a non-empty list")
    chat = []
    for message in messages:
        if message.get("role") not in ROLES:
            raise ValueError(f"unknown role {message.get('role')!r} (one of {', '.join(ROLES)})")
        out = {k: v for k, v in message.items() if k != "tool_calls"}
        content = message.get("content")
        out["content"] = content if isinstance(content, str) else _text(content)
        if message.get("tool_calls"):
            out["tool_calls"] = [_tool_call(call) for call in message["tool_calls"]]
        chat.append(out)
    return chat


def _tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    fn = call.get("function", call)
    arguments = fn.get("arguments") or {}
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    if not isinstance(arguments, Mapping):
        raise ValueError(f"the arguments of {fn.get('name')!r} are not an object")
    return {"type": "function", "function": {"name": fn["name"], "arguments": dict(arguments)}}


def _text(content: Any) -> str:  # noqa: ANN401
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def _tools_of(row: Row) -> list[dict[str, Any]]:
    tools = row.tools()
    if not all(isinstance(t, Mapping) for t in tools):
        raise ValueError("tool_schemas is not a list of function schemas")
    return tools


@functools.cache
def _dataset_class() -> type:
    """The dataset class: verl's ``MultiTurnSFTDataset`` reading our JSON columns."""
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    class JSONChatSFTDataset(MultiTurnSFTDataset):
        """verl's multi-turn SFT dataset; ``messages`` and ``tools`` are decoded per row."""

        def _read_files_and_process(self) -> None:
            super()._read_files_and_process()
            self.messages = [decoded(m, MESSAGES) for m in self.messages]
            if self.tools is not None:
                self.tools = [decoded(t, TOOLS) or None for t in self.tools]

        def _build_messages(self, example: dict) -> list:
            chat = decoded(example[self.messages_key], MESSAGES)
            return super()._build_messages({**example, self.messages_key: chat})

    JSONChatSFTDataset.__module__ = __name__
    return JSONChatSFTDataset


def __getattr__(name: str) -> Any:  # noqa: ANN401
    """:data:`DATASET_CLASS`, built on first use so that composing never imports verl.

    verl's trainer finds it with ``getattr`` on this module (``data.custom_cls``).
    """
    if name == DATASET_CLASS:
        return _dataset_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
