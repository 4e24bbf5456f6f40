"""verl's prompt of a row lists the row's own tools, in the row's order, as the local engine's does.

verl's tool agent loop reads ``extra_info.tool_selection`` of each row; the data copies verl reads
carry it (``slca_exp.engines.verl.tools.verl_rows``). The end-to-end check, verl's prompts
against the local engine's, is in ``test_verl_trains_on_cpu.py``.
"""

import json

import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.core.rows import Row
from slca_exp.data.synthetic import build_rows
from slca_exp.engines.verl.tools import schemas_of, tool_selection, verl_rows, write_verl_split

ROWS = build_rows(12, "train", seed=3)


def with_schemas(row, schemas):
    """A copy of ``row`` whose ``tool_schemas`` are ``schemas`` (in that order)."""
    copy = json.loads(json.dumps(row))
    copy["reward_model"]["ground_truth"]["tool_schemas"] = json.dumps(schemas)
    return copy


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_each_row_selects_exactly_its_schemas_in_its_order(data):
    row = ROWS[data.draw(st.integers(0, len(ROWS) - 1))]
    schemas = Row(row).tools()
    shown = data.draw(st.permutations(schemas))
    shown = shown[: data.draw(st.integers(1, len(shown)))]
    mine = with_schemas(row, shown)
    names = [s["function"]["name"] for s in schemas_of(ROWS)]
    (copy,) = verl_rows([mine], names)
    assert copy["extra_info"]["tool_selection"] == [s["function"]["name"] for s in shown]
    assert tool_selection(mine) == copy["extra_info"]["tool_selection"]
    assert sorted(copy["extra_info"]["tools_kwargs"]) == sorted(names)  # still every tool
    added = {"tools_kwargs", "tool_selection"}
    assert {k: v for k, v in copy["extra_info"].items() if k not in added} == mine["extra_info"]
    assert {k: v for k, v in copy.items() if k != "extra_info"} == {
        k: v for k, v in mine.items() if k != "extra_info"
    }  # nothing else changed


def test_the_parquet_copy_keeps_every_rows_selection(tmp_path):
    rows = [with_schemas(ROWS[0], Row(ROWS[0]).tools()[::-1]), *ROWS[1:]]
    names = [s["function"]["name"] for s in schemas_of(rows)]
    path = write_verl_split(rows, names, tmp_path / "train.parquet")
    read = pq.read_table(path).to_pylist()
    assert [r["extra_info"]["tool_selection"] for r in read] == [tool_selection(r) for r in rows]
    assert read[0]["extra_info"]["tool_selection"] != sorted(names)  # the row's order, not sorted
