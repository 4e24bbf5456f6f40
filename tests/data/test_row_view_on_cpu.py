"""Every reader of a split row reads it through one view, ``slca_exp.core.rows.Row``.

The view gives the values the row layout (``slca_exp/data/rows.py``) promises, over generated
rows, rows read back by pandas and hand-written Toucan rows; a field held as JSON text reads the
same as the field held decoded (a list, a tuple, a numpy array); and no module of ``slca_exp``
picks a row apart by hand (an ast scan for the layout's keys, which must find a planted one).
"""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.core import rows as view_module
from slca_exp.core.rows import Row, RowError, recorded_of
from slca_exp.data import rows as layout_module
from slca_exp.data.rows import gold_messages, sft_row
from slca_exp.data.synthetic import build_rows
from slca_exp.rewards import read_gold

from ..rewards.toucan import ROWS as TOUCAN_ROWS
from ..rewards.toucan import truth
from ..syntax import parse

PACKAGE = Path(view_module.__file__).resolve().parents[1]
HOMES = {Path(view_module.__file__).resolve(), Path(layout_module.__file__).resolve()}
"""The view, and the module that writes and checks rows: the only ones that index a row."""
ROW_KEYS = {
    "reward_model",
    "ground_truth",
    "tool_schemas",
    "question_content",
    "tool_responses",
    "messages",
    "prompt",
}
"""Keys of the row layout that only the view (and the writers) may index."""

SFT = [sft_row(r) for r in build_rows(8, "sft", seed=11)]
"""Generated SFT rows: two-call, one-call and irrelevant rows, each with its gold trajectory."""


def test_generated_rows_read_as_the_layout_says(split_rows):
    for name, rows in split_rows.items():
        for row in rows:
            view, gt = Row(row), row["reward_model"]["ground_truth"]
            assert view.truth() is gt  # the very object: the reward reads it once per prompt
            assert view.prompt() == row["prompt"]
            assert view.question() == gt["question_content"] == row["prompt"][-1]["content"]
            assert view.question() == read_gold(view.truth()).question
            assert view.tools() == json.loads(gt["tool_schemas"])
            assert [t["function"]["name"] for t in view.tools()] == view.allowed()
            assert view.allowed() == gt["allowed_tools"]
            assert view.recorded() == tuple(json.loads(row["extra_info"]["tool_responses"]))
            assert view.recorded_text() == row["extra_info"]["tool_responses"]  # as held
            if name == "sft":
                assert view.messages() == json.loads(row["messages"]) == gold_messages(row)
            else:
                assert view.messages() is None


def test_rows_read_by_pandas_read_as_rows_read_by_pyarrow(split_dir, split_rows):
    """pandas gives lists as numpy arrays (``prompt``, ``allowed_tools``); the view takes them."""
    for name, rows in split_rows.items():
        frame = pd.read_parquet(split_dir / f"{name}.parquet")
        records = frame.to_dict("records")
        assert isinstance(records[0]["prompt"], np.ndarray)
        for mine, theirs in zip(map(Row, records), map(Row, rows), strict=True):
            assert _read(mine) == _read(theirs)


def test_toucan_rows_read_without_recorded_responses_or_messages():
    for row in TOUCAN_ROWS:
        view = Row(row)
        assert view.question() == truth(row)["question_content"] == view.prompt()[-1]["content"]
        assert [t["function"]["name"] for t in view.tools()] == truth(row)["allowed_tools"]
        assert view.recorded() == () and view.recorded_text() == "[]"
        assert view.messages() is None
        assert read_gold(view.truth()).allowed == set(view.allowed())


def test_absent_and_empty_optional_fields_read_as_empty():
    row = copy.deepcopy(TOUCAN_ROWS[0])
    del truth(row)["tool_schemas"], truth(row)["question_content"], row["extra_info"]
    view = Row(row)
    assert view.tools() == [] and view.question() == "" and view.recorded() == ()
    for empty in (None, "", " ", "[]", []):
        truth(row)["tool_schemas"] = empty
        row["extra_info"] = {"tool_responses": empty}
        assert Row(row).tools() == [] and Row(row).recorded() == ()
    row["extra_info"] = None  # pandas' null struct
    assert Row(row).recorded() == ()


def test_an_unreadable_field_is_named():
    row = copy.deepcopy(SFT[0])
    row["reward_model"]["ground_truth"]["tool_schemas"] = "[{not json"
    with pytest.raises(RowError, match=r"reward_model\.ground_truth\.tool_schemas is not valid"):
        Row(row).tools()
    row["extra_info"]["tool_responses"] = '{"name": "f"}'
    with pytest.raises(RowError, match=r"extra_info\.tool_responses must be a list, got dict"):
        Row(row).recorded()
    row["messages"] = 7
    with pytest.raises(RowError, match="messages must be a list, got int"):
        Row(row).messages()
    row["reward_model"]["ground_truth"] = '["not", "an", "object"]'
    with pytest.raises(RowError, match="ground_truth must be an object, got list"):
        Row(row).question()


ENCODINGS = ("json", "list", "tuple", "array")


def encode(value, how):
    """``value`` (a decoded list) as a row may hold it."""
    if how == "json":
        return json.dumps(value)
    if how == "tuple":
        return tuple(value)
    if how == "array":
        held = np.empty(len(value), dtype=object)
        held[:] = value
        return held
    return list(value)


@settings(max_examples=60, deadline=None)
@given(
    index=st.integers(0, len(SFT) - 1),
    schemas=st.sampled_from(ENCODINGS),
    schema_items=st.sampled_from(("decoded", "json")),
    allowed=st.sampled_from(ENCODINGS),
    recorded=st.sampled_from(ENCODINGS),
    messages=st.sampled_from(ENCODINGS),
    prompt=st.sampled_from(ENCODINGS),
    ground_truth=st.sampled_from(("mapping", "json")),
)
def test_json_text_and_decoded_fields_read_the_same(
    index, schemas, schema_items, allowed, recorded, messages, prompt, ground_truth
):
    row = SFT[index]
    gt = row["reward_model"]["ground_truth"]
    items = json.loads(gt["tool_schemas"])
    if schema_items == "json":  # each schema as JSON text inside a list
        items = [json.dumps(s) for s in items]
    held_gt = {
        **gt,
        "tool_schemas": encode(items, schemas),
        "allowed_tools": encode(gt["allowed_tools"], allowed),
    }
    if ground_truth == "json":  # a whole ground truth as JSON text (read_gold takes it too)
        held_gt = json.dumps(held_gt, default=list)
    held = {
        **row,
        "prompt": encode(row["prompt"], prompt),
        "messages": encode(json.loads(row["messages"]), messages),
        "reward_model": {
            **row["reward_model"],
            "ground_truth": held_gt,
        },
        "extra_info": {
            **row["extra_info"],
            "tool_responses": encode(json.loads(row["extra_info"]["tool_responses"]), recorded),
        },
    }
    assert _read(Row(held)) == _read(Row(row))
    # what verl's tools receive decodes to the same responses, however the row held them
    assert recorded_of(Row(held).recorded_text()) == Row(row).recorded()


def _read(view: Row) -> dict:
    """Everything the view reads, as plain values."""
    return {
        "prompt": [dict(m) for m in view.prompt()],
        "question": view.question(),
        "tools": view.tools(),
        "allowed": view.allowed(),
        "recorded": view.recorded(),
        "messages": view.messages(),
    }


def hand_parsed(source: str, where: str) -> list[str]:
    """``where:line: <code>`` for each subscript of ``source`` that indexes a row's layout key."""
    tree = parse(source)
    found = [
        (node.lineno, ast.get_source_segment(source, node))
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and node.slice.value in ROW_KEYS
    ]
    return [f"{where}:{line}: {text}" for line, text in sorted(found)]


def test_no_module_reads_a_row_by_hand():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.resolve() not in HOMES:
            where = str(path.relative_to(PACKAGE.parent))
            found += hand_parsed(path.read_text(encoding="utf-8"), where)
    assert not found, "read these through slca_exp.core.rows.Row:\n" + "\n".join(found)


def test_the_scan_finds_planted_reads():
    planted = (
        "import json\n"
        "def tools(row):\n"
        "    raw = row['reward_model']['ground_truth'].get('tool_schemas') or '[]'\n"
        "    return json.loads(raw)\n"
        "def trajectory(row):\n"
        '    """row["messages"] in a docstring is text, not a read."""\n'
        "    return json.loads(row['messages']), list(row['prompt'])\n"
        "def recorded(row, extra):\n"
        "    return extra['tool_responses'], row.get('extra_info', {})['question_content']\n"
    )
    found = hand_parsed(planted, "planted.py")
    assert [line.split(":")[1] for line in found] == ["3", "3", "7", "7", "9", "9"]
    assert "planted.py:7: row['messages']" in found
