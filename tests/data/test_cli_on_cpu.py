import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slca_exp.commands import main

EXE = shutil.which("slca-exp") or str(Path(sys.executable).parent / "slca-exp")


def test_synth_writes_the_three_splits_and_reports_them(tmp_path, capsys):
    assert main(["data", "synth", "--out", str(tmp_path), "--rows", "8", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    for name, rows in (("sft", 8), ("train", 8), ("val", 16)):
        path = tmp_path / f"{name}.parquet"
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert f"{name:5s} {rows:6d} rows  sha256 {digest}" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rows", "0"], "--rows: expected a positive integer, got 0"),
        (["--rows", "many"], "--rows: expected a positive integer, got 'many'"),
        (["--seed", "x"], "argument --seed: invalid int value"),
        ([], "the following arguments are required: --out"),
    ],
)
def test_bad_arguments_exit_2_with_the_reason(tmp_path, capsys, args, message):
    argv = [
        "data",
        "synth",
        *(["--out", str(tmp_path)] if "--out" not in args and args else []),
        *args,
    ]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_folder_of_foreign_files_exits_2(tmp_path, capsys):
    (tmp_path / "val.parquet").write_text("mine")
    assert main(["data", "synth", "--out", str(tmp_path)]) == 2
    assert "not generated here" in capsys.readouterr().err


def test_console_script_runs_synth(tmp_path):
    res = subprocess.run(
        [EXE, "data", "synth", "--out", str(tmp_path), "--rows", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "rows=4 seed=42" in res.stdout and (tmp_path / "sft.parquet").is_file()
