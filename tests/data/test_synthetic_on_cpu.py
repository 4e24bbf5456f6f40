import hashlib
import json

import pytest

from slca_exp.config.services import JudgeConfig, SimulatorConfig
from slca_exp.data import domain
from slca_exp.data.rows import hermes_text
from slca_exp.data.synthetic import MANIFEST, SyntheticFolderError, generate, split_sizes
from slca_exp.judges import JudgeRequest, build_judge
from slca_exp.rewards import read_gold, tool_process_reward
from slca_exp.simulators import build_simulator
from slca_exp.simulators.base import SimContext
from slca_exp.simulators.schema import check_call

from .conftest import ROWS, SEED


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_generations_give_identical_bytes_and_another_seed_does_not(split_dir, tmp_path):
    again = generate(tmp_path / "again", ROWS, SEED)
    other = generate(tmp_path / "other", ROWS, SEED + 1)
    for name, path in again.items():
        assert sha(path) == sha(split_dir / f"{name}.parquet"), name
        assert sha(path) != sha(other[name]), name


def test_sizes_follow_rows():
    assert split_sizes(256) == {"sft": 256, "train": 256, "val": 64}
    assert split_sizes(10) == {"sft": 10, "train": 10, "val": 16}


def test_a_complete_folder_is_reused_and_a_changed_one_regenerated(tmp_path):
    paths = generate(tmp_path, 8, 1)
    stamp = {n: p.stat().st_mtime_ns for n, p in paths.items()}
    assert generate(tmp_path, 8, 1) == paths
    assert {n: p.stat().st_mtime_ns for n, p in paths.items()} == stamp
    before = sha(paths["train"])
    generate(tmp_path, 9, 1)  # other parameters: the folder is rewritten
    assert json.loads((tmp_path / MANIFEST).read_text())["rows"] == 9
    assert sha(paths["train"]) != before
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest.json",
        "sft.parquet",
        "train.parquet",
        "val.parquet",
    ]


def test_foreign_split_files_are_never_overwritten(tmp_path):
    (tmp_path / "train.parquet").write_text("mine")
    with pytest.raises(SyntheticFolderError, match="not generated here"):
        generate(tmp_path, 8, 1)
    assert (tmp_path / "train.parquet").read_text() == "mine"
    with pytest.raises(ValueError, match="positive"):
        generate(tmp_path / "x", 0, 1)


def test_val_tool_questions_are_not_training_questions(split_rows):
    train = {r["prompt"][1]["content"] for r in split_rows["train"]}
    for row in split_rows["val"]:
        if row["reward_model"]["ground_truth"]["subset_name"] == "tool_call":
            assert row["prompt"][1]["content"] not in train


def test_gold_rollouts_score_full_strict_tool_reward_and_a_good_judge_rating(split_rows):
    judge = build_judge(JudgeConfig())
    for name, rows in split_rows.items():
        requests = []
        for row in rows:
            gt = row["reward_model"]["ground_truth"]
            text = hermes_text(row)
            reward = tool_process_reward(text, gt, variant="strict")
            assert reward.score == pytest.approx(1.0), (name, text)
            gold = read_gold(gt)
            # On irrelevant rows not calling is right, so the judge rates the reply anyway
            # (what the strict reward asks of it).
            requests.append(JudgeRequest(gold.question, text, gold.needs_call))
        ratings = [r.rating for r in judge.score(requests)]
        assert min(ratings) >= 4, name
        assert sum(r == 5 for r in ratings) >= 0.9 * len(ratings), name


def test_gold_calls_pass_the_schema_check_and_replay_their_recorded_responses(split_rows):
    simulator = build_simulator(SimulatorConfig())
    for row in split_rows["train"]:
        gold = read_gold(row["reward_model"]["ground_truth"])
        recorded = tuple(json.loads(row["extra_info"]["tool_responses"]))
        context = SimContext(gold.question, recorded)
        for call, expected in zip(gold.calls, recorded, strict=True):
            schema = gold.tool_schemas[call.name]
            assert check_call(call, schema, required=True, types=True) == []
            response = simulator.respond(call, schema, context)
            assert (response.status, response.reason) == ("ok", "recorded")
            assert response.content == expected["content"]


def test_domain_has_six_typed_tools_with_deterministic_responses():
    assert len(domain.TOOLS) >= 6
    for tool in domain.TOOLS:
        fn = tool.schema["function"]
        assert tool.schema["type"] == "function" and fn["description"]
        params = fn["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
        assert all(
            p["type"] in ("string", "number", "integer") for p in params["properties"].values()
        )
    call = {"amount": 120, "from_currency": "USD", "to_currency": "EUR"}
    content = domain.respond("convert_currency", call)
    assert content == domain.respond("convert_currency", dict(call))
    assert json.loads(content) == {"from": "USD", "to": "EUR", "rate": 0.92, "result": 110.4}
    assert (
        domain.reply("convert_currency", call, content) == "120 USD is 110.4 EUR at a rate of 0.92."
    )
    # Another argument, another draw.
    assert domain.respond("get_stock_price", {"symbol": "IBM"}) != domain.respond(
        "get_stock_price", {"symbol": "AAPL"}
    )
