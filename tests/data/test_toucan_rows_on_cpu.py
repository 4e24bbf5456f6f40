"""Toucan-shaped rows load as they are; rows the reward cannot score are refused with their index.

A row whose gold calls exist while ``allowed_tools`` is empty, or whose gold names a tool it does
not allow, would score even the exact gold call as invalid: ``data=toucan`` refuses the split,
naming the file and the rows, and nothing starts.
"""

import copy

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slca_exp.data.rows import check_rows
from slca_exp.data.splits import DataError, load_split
from slca_exp.preflight.compose import compose_run
from slca_exp.preflight.validate import ConfigError, validate
from slca_exp.recipe import build_recipe

from ..rewards.toucan import CALC, ROWS, UI, truth


def write(rows, path):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def unscorable(rows):
    """Copies of ``rows`` with row 1 allowing no tools and row 3 naming a tool it does not allow."""
    bad = copy.deepcopy(rows)
    truth(bad[1])["allowed_tools"] = []
    truth(bad[1])["gold_tool_calls"] = [UI[0]]
    truth(bad[3])["gold_tool_calls"] = [CALC[0], "calculator-server-sqrt"]
    return bad


def test_toucan_rows_pass_the_row_check_as_they_are(tmp_path):
    rows = ROWS * 3
    assert check_rows(rows, "train") == []
    split = load_split(write(rows, tmp_path / "rl.parquet"), "train")
    assert split.num_rows == len(rows)
    # the gold names survive the parquet round trip as bare names
    assert truth(split.rows[2])["gold_tool_calls"] == truth(ROWS[2])["gold_tool_calls"]


def test_unscorable_rows_are_reported_with_their_index_and_why():
    lines = check_rows(unscorable(ROWS), "train")
    assert [line.split(":")[0] for line in lines] == ["row 1", "row 3"]
    assert "allowed_tools is empty but the row has gold calls" in lines[0]
    assert "name tools outside allowed_tools: ['calculator-server-sqrt']" in lines[1]
    # an irrelevant row may allow no tools: nothing to score against
    empty = copy.deepcopy(ROWS[3])
    truth(empty)["allowed_tools"] = []
    assert check_rows([empty], "val") == []


@pytest.mark.parametrize("gold", [[UI[0]], '["ui-reference-server-list"]', [[UI[0]]]])
def test_every_gold_shape_is_checked(gold):
    row = copy.deepcopy(ROWS[2])
    truth(row)["allowed_tools"] = [UI[1]]
    truth(row)["gold_tool_calls"] = gold
    (line,) = check_rows([row], "train")
    assert line.startswith("row 0: ") and UI[0] in line


def test_data_toucan_refuses_the_split_and_nothing_starts(tmp_path):
    folder = tmp_path / "toucan"
    folder.mkdir()
    write(unscorable(ROWS), folder / "rl.parquet")
    write(ROWS, folder / "eval_4k.parquet")
    with pytest.raises(DataError) as err:
        load_split(folder / "rl.parquet", "train")
    (problem,) = err.value.problems
    assert problem.key == "data.files.train"
    assert str(folder / "rl.parquet") in problem.what
    assert "2 of 4 rows break the row layout (bad rows: 1, 3)" in problem.what
    config = validate(compose_run(["data=toucan", f"data.dir={folder}", "data.files.sft=null"]))
    with pytest.raises(ConfigError) as refused:
        build_recipe(config)
    assert [p.key for p in refused.value.problems] == ["data.files.train"]
    assert "bad rows: 1, 3" in str(refused.value) and "rl.parquet" in str(refused.value)
    # the same folder with scorable rows builds its recipe
    write(ROWS, folder / "rl.parquet")
    assert build_recipe(config).data["files"]["train"]["rows"] == len(ROWS)
