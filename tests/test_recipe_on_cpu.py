import hashlib
import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slca_exp.core.hashing import sha256_file
from slca_exp.data.synthetic import RL_SCHEMA, build_rows
from slca_exp.preflight.compose import compose_run
from slca_exp.preflight.validate import ConfigError, validate
from slca_exp.recipe import COMPONENTS, build_recipe

EXE = shutil.which("slca-exp") or str(Path(sys.executable).parent / "slca-exp")
TAGS = {
    "slca.backbone",
    "slca.reward",
    "slca.judge",
    "slca.simulator",
    "slca.data",
    "slca.estimator",
    "slca.fingerprint",
    "slca.sweep",
}


def recipe_of(*overrides):
    return build_recipe(validate(compose_run(list(overrides))))


def write_parquet(path, rows, split="train"):
    """``rows`` valid RL rows (the recipe checks every row of a split it records)."""
    table = pa.Table.from_pylist(build_rows(rows, split, seed=0), schema=RL_SCHEMA)
    pq.write_table(table, path)
    return path


def test_default_recipe_has_five_components_tags_and_a_stable_fingerprint():
    recipe = recipe_of()
    assert set(recipe.components()) == set(COMPONENTS)
    assert re.fullmatch(r"[0-9a-f]{64}", recipe.fingerprint)
    assert recipe.short_fingerprint == recipe.fingerprint[:12]
    tags = recipe.tags()
    assert set(tags) == TAGS
    assert tags["slca.reward"] == "hierr/strict"
    assert tags["slca.backbone"] == "builtin:tiny"
    assert tags["slca.estimator"] == "slca_grpo"
    assert tags["slca.data"] == "synthetic:synthetic/rows=256,seed=42"
    assert tags["slca.fingerprint"] == recipe.fingerprint[:12]
    assert recipe_of().fingerprint == recipe.fingerprint
    assert json.loads(recipe.to_json()) == recipe.to_dict()


def test_fingerprint_covers_the_five_components_only():
    base = recipe_of()
    # Algorithm and seed are swept over one recipe: same fingerprint.
    assert recipe_of("algorithm=grpo", "seed=7").fingerprint == base.fingerprint
    for override in (
        "backbone.dtype=bfloat16",
        "reward.variant=paper",
        "simulator.check_required_args=false",
        "data.rows=10",
    ):
        assert recipe_of(override).fingerprint != base.fingerprint, override


def test_normalised_reward_records_the_rescaled_weights():
    recipe = recipe_of(
        "reward.normalize=true",
        "reward.tool_weights.format=1",
        "reward.tool_weights.name=1",
        "reward.tool_weights.key=1",
        "reward.tool_weights.value=1",
        "reward.tool_weights.parallel=4",
    )
    weights = recipe.reward["tool_weights"]
    assert weights["parallel"] == pytest.approx(0.5)
    assert weights["format"] == pytest.approx(0.125)
    assert recipe.reward["normalized"] is True


def test_data_files_are_hashed_counted_and_checked(tmp_path):
    train = write_parquet(tmp_path / "train.parquet", 7)
    write_parquet(tmp_path / "val.parquet", 3, "val")
    recipe = recipe_of(
        "data.kind=files",
        f"data.dir={tmp_path}",
        "data.files.train=train.parquet",
        "data.files.val=val.parquet",
    )
    files = recipe.data["files"]
    assert files["train"]["rows"] == 7 and files["val"]["rows"] == 3
    assert files["train"]["sha256"] == hashlib.sha256(train.read_bytes()).hexdigest()
    assert files["train"]["path"] == str(train.resolve())
    # The same bytes elsewhere are the same recipe.
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(train, moved / "train.parquet")
    shutil.copy(tmp_path / "val.parquet", moved / "val.parquet")
    again = recipe_of(
        "data.kind=files",
        f"data.dir={moved}",
        "data.files.train=train.parquet",
        "data.files.val=val.parquet",
    )
    assert again.fingerprint == recipe.fingerprint
    assert recipe.tags()["slca.data"].startswith("synthetic@")


def test_incomplete_recipe_lists_every_missing_piece(tmp_path):
    (tmp_path / "not.parquet").write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError) as err:
        recipe_of(
            "data.kind=files",
            f"data.dir={tmp_path}",
            "data.files.train=missing.parquet",
            "data.files.val=not.parquet",
            f"backbone.chat_template={tmp_path / 'nope.jinja'}",
        )
    keys = {p.key for p in err.value.problems}
    assert keys == {"data.files.train", "data.files.val", "backbone.chat_template"}
    assert "does not exist" in str(err.value) and "not a parquet file" in str(err.value)


def test_local_backbone_folder_must_exist_and_chat_template_is_hashed(tmp_path):
    with pytest.raises(ConfigError, match="backbone.path"):
        recipe_of("backbone.source=local", f"backbone.path={tmp_path / 'weights'}")
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages }}")
    recipe = recipe_of(f"backbone.chat_template={template}")
    expected = hashlib.sha256(template.read_bytes()).hexdigest()
    assert recipe.backbone["chat_template"]["sha256"] == expected == sha256_file(template)


def test_code_versions_are_recorded():
    code = recipe_of().code
    assert code["packages"]["mlflow"] == metadata.version("mlflow")
    assert code["packages"]["slca-exp"] == metadata.version("slca-exp")
    assert "vllm" in code["packages"]
    if (Path(__file__).resolve().parents[1] / ".git").exists():
        assert re.fullmatch(r"[0-9a-f]{40}", code["git_sha"])
        assert isinstance(code["git_dirty"], bool)


def test_sweep_id_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("SLCA_EXP_SWEEP_ID", "sweep-123")
    recipe = recipe_of()
    assert recipe.sweep_id == "sweep-123" and recipe.tags()["slca.sweep"] == "sweep-123"


def test_train_refuses_an_incomplete_recipe_before_creating_anything(tmp_path):
    res = subprocess.run(
        [
            EXE,
            "train",
            "data.kind=files",
            "data.files.train=missing.parquet",
            "data.files.val=missing_val.parquet",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert "data.files.train" in res.stderr and "data.files.val" in res.stderr
    assert "Traceback" not in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_missing_judge_prompt_is_refused_with_its_key(tmp_path):
    with pytest.raises(ConfigError) as err:
        recipe_of(
            "judge.backend=openai",
            "judge.model=gpt-oss-120b",
            "judge.base_url=http://127.0.0.1:9/v1",
            f"judge.prompt={tmp_path / 'missing_prompt.txt'}",
        )
    assert [p.key for p in err.value.problems] == ["judge.prompt"]


def test_an_http_judge_is_recorded_with_model_prompt_hash_and_decoding():
    recipe = recipe_of(
        "judge.backend=openai",
        "judge.model=gpt-oss-120b",
        "judge.base_url=http://127.0.0.1:9/v1",
        "judge.prompt_version=v1",
    )
    judge = recipe.judge
    assert judge["model"] == "gpt-oss-120b" and re.fullmatch(
        r"[0-9a-f]{64}", judge["prompt_sha256"]
    )
    assert judge["temperature"] == 0.0
    assert recipe.tags()["slca.judge"] == "openai:gpt-oss-120b@v1"
    assert recipe.fingerprint != recipe_of().fingerprint
