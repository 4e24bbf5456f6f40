import copy
import hashlib
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slca_exp.data.splits import (
    SPLITS,
    DataError,
    load_split,
    load_splits,
    split_files,
    synthetic_dir,
)
from slca_exp.data.synthetic import RL_SCHEMA
from slca_exp.preflight.compose import compose_run
from slca_exp.preflight.validate import ConfigError, validate
from slca_exp.recipe import build_recipe


def config_of(*overrides):
    return validate(compose_run(list(overrides)))


def toucan_folder(split_dir, folder):
    """The synthetic split under the paper's Toucan file names (a stand-in for the real files)."""
    folder.mkdir()
    for ours, theirs in (("sft", "sft_split_42k"), ("train", "rl"), ("val", "eval_4k")):
        shutil.copy(split_dir / f"{ours}.parquet", folder / f"{theirs}.parquet")
    return folder


def test_synthetic_splits_land_in_the_default_folder_under_the_output_root(tmp_path):
    config = config_of(f"tracking.root={tmp_path}", "data.rows=12", "data.seed=3")
    folder = tmp_path / "data" / "synthetic" / "rows=12-seed=3"
    assert synthetic_dir(config) == folder
    assert split_files(config) == {n: folder / f"{n}.parquet" for n in SPLITS}
    splits = load_splits(config)
    assert [s.num_rows for s in splits.values()] == [12, 12, 16]
    for name, split in splits.items():
        assert split.name == name and split.num_rows == len(split.rows)
        assert split.sha256 == hashlib.sha256(split.path.read_bytes()).hexdigest()


def test_data_dir_overrides_the_synthetic_folder(tmp_path):
    config = config_of(f"tracking.root={tmp_path / 'root'}", f"data.dir={tmp_path / 'mine'}")
    assert set(split_files(config).values()) == {tmp_path / "mine" / f"{n}.parquet" for n in SPLITS}
    assert not (tmp_path / "root").exists()


def test_user_files_load_and_sft_is_optional(split_dir):
    config = config_of(
        "data.kind=files",
        f"data.dir={split_dir}",
        "data.files.train=train.parquet",
        "data.files.val=val.parquet",
    )
    assert sorted(load_splits(config)) == ["train", "val"]


def test_a_missing_file_names_its_key_and_the_fix(split_dir):
    config = config_of(
        "data.kind=files",
        f"data.dir={split_dir}",
        "data.files.train=nope.parquet",
        "data.files.val=val.parquet",
    )
    with pytest.raises(DataError) as err:
        load_splits(config)
    (problem,) = err.value.problems
    assert problem.key == "data.files.train" and "does not exist" in problem.what
    assert "fix data.files.train or data.dir" in problem.fix


def test_bad_rows_name_the_key_and_the_first_bad_indexes(split_dir, split_rows, tmp_path):
    rows = copy.deepcopy(split_rows["val"])
    for i in (2, 5):
        rows[i]["reward_model"]["ground_truth"]["gold_tool_calls"] = "{"
    path = tmp_path / "val.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=RL_SCHEMA), path)
    with pytest.raises(DataError) as err:
        load_split(path, "val")
    (problem,) = err.value.problems
    assert problem.key == "data.files.val"
    assert f"2 of {len(rows)} rows break the row layout (bad rows: 2, 5)" in problem.what
    assert "row 5: reward_model.ground_truth.gold_tool_calls is not valid JSON" in problem.what
    # The recipe refuses the run with the same problem.
    shutil.copy(split_dir / "train.parquet", tmp_path / "train.parquet")
    with pytest.raises(ConfigError) as refused:
        build_recipe(
            config_of(
                "data.kind=files",
                f"data.dir={tmp_path}",
                "data.files.train=train.parquet",
                "data.files.val=val.parquet",
            )
        )
    assert [p.key for p in refused.value.problems] == ["data.files.val"]
    assert "bad rows: 2, 5" in str(refused.value)


def test_recipe_records_path_sha256_and_rows_of_every_synthetic_split(tmp_path):
    recipe = build_recipe(config_of(f"tracking.root={tmp_path}", "data.rows=20"))
    files = recipe.data["files"]
    assert sorted(files) == ["sft", "train", "val"]
    for name, entry in files.items():
        path = tmp_path / "data" / "synthetic" / "rows=20-seed=42" / f"{name}.parquet"
        assert entry == {
            "path": str(path),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "rows": {"sft": 20, "train": 20, "val": 16}[name],
        }
    assert recipe.data["sizes"] == {"sft": 20, "train": 20, "val": 16}
    # Same bytes at another root: same recipe.
    other = build_recipe(config_of(f"tracking.root={tmp_path / 'b'}", "data.rows=20"))
    assert other.fingerprint == recipe.fingerprint


def test_a_refused_recipe_generates_nothing(tmp_path):
    with pytest.raises(ConfigError) as err:
        build_recipe(
            config_of(f"tracking.root={tmp_path}", f"backbone.chat_template={tmp_path / 'x.j2'}")
        )
    assert [p.key for p in err.value.problems] == ["backbone.chat_template"]
    assert not (tmp_path / "data").exists()


def test_synthetic_data_refuses_file_names():
    with pytest.raises(ConfigError) as err:
        compose_run(["data.files.train=train.parquet"])
    (problem,) = err.value.problems
    assert problem.key == "data.files.train" and "data.kind=files" in problem.fix


def test_toucan_needs_its_folder_and_reads_the_papers_file_names(split_dir, tmp_path):
    with pytest.raises(ConfigError) as err:
        build_recipe(config_of("data=toucan"))
    (problem,) = err.value.problems
    assert problem.key == "data.dir"
    assert "sft_split_42k.parquet, rl.parquet, eval_4k.parquet" in problem.what
    assert "data.dir=" in problem.fix and "Toucan-1.5M" in problem.fix
    with pytest.raises(ConfigError) as err:
        build_recipe(config_of("data=toucan", f"data.dir={tmp_path / 'empty'}"))
    assert [p.key for p in err.value.problems] == [f"data.files.{n}" for n in SPLITS]
    folder = toucan_folder(split_dir, tmp_path / "toucan")
    recipe = build_recipe(config_of("data=toucan", f"data.dir={folder}"))
    files = recipe.data["files"]
    assert files["train"]["path"] == str(folder / "rl.parquet")
    assert files["val"]["rows"] == 16 and files["sft"]["rows"] == 64
