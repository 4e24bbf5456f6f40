import copy
import json

import numpy as np
import pytest

from slca_exp.data.rows import MAX_REPORTED, check_rows, gold_messages, hermes_text
from slca_exp.rewards import read_gold

from .conftest import ROWS


def test_generated_rows_follow_the_layout_exactly(split_rows):
    for name, rows in split_rows.items():
        assert check_rows(rows, name) == [], name
        for i, row in enumerate(rows):
            expected = {"data_source", "prompt", "ability", "reward_model", "extra_info"}
            assert set(row) == expected | ({"messages"} if name == "sft" else set())
            assert row["data_source"] == "slca_synthetic" and row["ability"] == "tool_call"
            assert [m["role"] for m in row["prompt"]] == ["system", "user"]
            gt = row["reward_model"]["ground_truth"]
            assert row["reward_model"]["style"] == "rule"
            assert set(gt) == {
                "allowed_tools",
                "gold_tool_calls",
                "question_content",
                "subset_name",
                "tool_schemas",
            }
            # Shapes that vary per row travel as JSON strings (one parquet schema for all rows).
            for key in ("gold_tool_calls", "tool_schemas"):
                assert isinstance(gt[key], str)
            assert isinstance(row["extra_info"]["tool_responses"], str)
            assert row["extra_info"]["index"] == i and row["extra_info"]["split"] == name
            gold = read_gold(gt)
            assert gold.question == row["prompt"][1]["content"]
            assert sorted(gold.tool_schemas) == sorted(gt["allowed_tools"])


def test_row_mix_is_half_single_quarter_parallel_quarter_irrelevant(split_rows):
    counts = {}
    for row in split_rows["train"]:
        steps = json.loads(row["reward_model"]["ground_truth"]["gold_tool_calls"])
        kind = "irrelevant" if not steps else ("single", "parallel")[len(steps[0]) - 1]
        assert len(steps) <= 1  # every call of a row is in one turn
        counts[kind] = counts.get(kind, 0) + 1
        subset = row["reward_model"]["ground_truth"]["subset_name"]
        assert subset == ("irrelevant" if kind == "irrelevant" else "tool_call")
    assert counts == {"single": ROWS // 2, "parallel": ROWS // 4, "irrelevant": ROWS // 4}


def test_texts_are_short_enough_for_a_tiny_model(split_rows):
    for rows in split_rows.values():
        for row in rows:
            assert len(row["prompt"][1]["content"]) <= 80
            assert 20 <= len(row["extra_info"]["reply"]) <= 120
            for response in json.loads(row["extra_info"]["tool_responses"]):
                assert 2 <= len(json.loads(response["content"])) <= 4


def test_sft_messages_are_the_gold_trajectory_with_parallel_calls_in_one_message(split_rows):
    seen = set()
    for row in split_rows["sft"]:
        messages = json.loads(row["messages"])
        assert messages == gold_messages(row)
        roles = [m["role"] for m in messages]
        calls = json.loads(row["reward_model"]["ground_truth"]["gold_tool_calls"])
        n = len(calls[0]) if calls else 0
        if n == 0:
            assert roles == ["system", "user", "assistant"]
        else:
            assert roles == ["system", "user", "assistant"] + ["tool"] * n + ["assistant"]
            assert messages[2]["content"] == ""
            assert [c["function"] for c in messages[2]["tool_calls"]] == calls[0]
            assert all(c["type"] == "function" for c in messages[2]["tool_calls"])
            assert [m["name"] for m in messages[3 : 3 + n]] == [c["name"] for c in calls[0]]
        assert messages[-1] == {"role": "assistant", "content": row["extra_info"]["reply"]}
        seen.add(n)
    assert seen == {0, 1, 2}


def test_hermes_text_has_one_block_per_call_then_responses_then_the_reply(split_rows):
    row = next(
        r for r in split_rows["train"] if len(json.loads(r["extra_info"]["tool_responses"])) == 2
    )
    text = hermes_text(row)
    assert text.count('<tool_call>\n{"name": ') == 2 and text.count("<tool_response>") == 2
    assert text.index("</tool_call>") < text.index("<tool_response>")
    assert text.endswith(row["extra_info"]["reply"])


def _corrupt(rows):
    bad = copy.deepcopy(rows)
    bad[1]["reward_model"]["ground_truth"]["gold_tool_calls"] = "[[{"
    bad[3]["prompt"] = [{"role": "system", "content": "only a system message"}]
    bad[4]["extra_info"]["index"] = 99
    del bad[6]["reward_model"]
    bad[7]["extra_info"]["tool_responses"] = "[]"
    return bad


def test_bad_rows_are_reported_with_their_index_and_what_is_wrong(split_rows):
    lines = check_rows(_corrupt(split_rows["train"]), "train")
    assert [line.split(":")[0] for line in lines] == ["row 1", "row 3", "row 4", "row 6", "row 7"]
    text = "\n".join(lines)
    assert "reward_model.ground_truth.gold_tool_calls is not valid JSON" in text
    assert "row 3: prompt has no user message" in text
    assert "row 4: extra_info.index must be 4" in text
    assert "row 6: reward_model.ground_truth is missing" in text
    assert "row 7: extra_info.tool_responses must hold one response per gold call" in text


def test_sft_rows_need_messages_and_many_bad_rows_are_summarised(split_rows):
    rows = copy.deepcopy(split_rows["sft"])
    for row in rows:
        row["messages"] = "not json"
    lines = check_rows(rows, "sft")
    assert len(lines) == MAX_REPORTED + 1
    assert lines[0].startswith("row 0: messages (the SFT trajectory)")
    assert (
        lines[-1]
        == f"... and {len(rows) - MAX_REPORTED} more bad rows ({len(rows)} of {len(rows)})"
    )
    # The same rows are fine as RL rows: messages belong to the SFT split only.
    assert check_rows(split_rows["train"], "train") == []


def test_user_rows_need_only_what_rewards_and_engine_read(split_rows):
    # A Toucan-like row: another data source, no extra_info, lists as numpy arrays (pandas).
    row = copy.deepcopy(split_rows["train"][0])
    row["data_source"] = "toucan"
    row["prompt"] = np.array(row["prompt"], dtype=object)
    del row["extra_info"]
    assert check_rows([row], "train") == []
    row["reward_model"]["ground_truth"]["tool_schemas"] = '[{"function": {}}]'
    assert "tool_schemas must be OpenAI-style" in check_rows([row], "train")[0]


@pytest.mark.parametrize("row", [None, "text", 3])
def test_a_row_that_is_not_an_object_is_reported(row):
    assert check_rows([row], "val") == [f"row 0: not an object (got {type(row).__name__})"]
