"""The data sources: one registry keyed by ``data.kind``; each says where its files are."""

import pytest

from slca_exp.data.sources import DATA_SOURCES, data_source
from slca_exp.data.splits import split_files
from slca_exp.preflight.compose import check_overrides, compose_run
from slca_exp.preflight.validate import validate
from slca_exp.registry import UnknownNameError


def config_of(*overrides):
    return validate(compose_run(list(overrides)))


def test_the_built_in_sources_are_registry_entries():
    assert DATA_SOURCES.names() == ["files", "synthetic"]
    assert (data_source("synthetic").generates, data_source("files").generates) == (True, False)
    with pytest.raises(UnknownNameError, match="Did you mean 'files'"):
        data_source("file")


def test_each_source_plans_the_files_it_then_resolves_without_making_them_first(
    tmp_path, split_dir
):
    synthetic = config_of(f"tracking.root={tmp_path}", "data.rows=8")
    planned = data_source("synthetic").planned(synthetic)
    assert not tmp_path.joinpath("data").exists()  # planning writes nothing
    assert split_files(synthetic) == planned
    files = config_of(
        "data.kind=files",
        f"data.dir={split_dir}",
        "data.files.train=train.parquet",
        "data.files.val=val.parquet",
    )
    assert data_source("files").planned(files) == split_files(files)
    assert data_source("files").folder(files) == split_dir


def test_an_unknown_kind_is_refused_with_the_registered_ones():
    _, problems = check_overrides(["data.kind=synthtic"])
    (problem,) = problems
    assert problem.key == "data.kind"
    assert "Did you mean 'synthetic'?" in problem.what and "files, synthetic" in problem.what
    assert "SLCA_EXP_PLUGINS" in problem.fix
