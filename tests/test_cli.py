"""The command line, run as a user runs it: a subprocess of the installed console script (the
help texts, which start nothing, in this process)."""

import argparse
import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slca_exp.commands import USAGE, main

EXE = shutil.which("slca-exp") or str(Path(sys.executable).parent / "slca-exp")


def cli(*args, cwd):
    return subprocess.run([EXE, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_validate_reports_both_problems_with_full_keys_and_exit_2(tmp_path):
    res = cli(
        "validate", "algorithm=slca_grpo", "algorithm.eps=-1", "+algorithm.bogus=3", cwd=tmp_path
    )
    assert res.returncode == 2
    assert "algorithm.eps" in res.stderr and "algorithm.bogus" in res.stderr
    assert "2 problems" in res.stderr and "Traceback" not in res.stderr + res.stdout
    assert list(tmp_path.iterdir()) == []


def test_validate_accepts_a_good_recipe(tmp_path):
    res = cli("validate", "-m", "algorithm=grpo,toolpo_grpo", "seed=3", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "valid (2 jobs)" in res.stdout


def test_train_cfg_job_prints_the_composed_recipe(tmp_path):
    res = cli("train", "--cfg", "job", "algorithm=grpo", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for key in (
        "backbone:",
        "reward:",
        "judge:",
        "simulator:",
        "data:",
        "algorithm:",
        "engine:",
        "tracking:",
    ):
        assert key in res.stdout
    assert "name: grpo" in res.stdout


def test_bad_sweep_is_refused_before_anything_is_created(tmp_path):
    res = cli("train", "-m", "algorithm=grpo,slca_grpo", "algorithm.eps=0,1e-6", cwd=tmp_path)
    assert res.returncode == 2
    assert "algorithm.eps" in res.stderr and "2 of 4 jobs" in res.stderr
    assert not (tmp_path / "multirun").exists() and not (tmp_path / "outputs").exists()


def test_user_config_dir_from_the_command_line(tmp_path):
    conf = tmp_path / "myconf" / "judge"
    conf.mkdir(parents=True)
    (conf / "vllm.yaml").write_text(
        "defaults:\n  - /schema/judge@_here_\n  - _self_\nname: vllm-judge\nbackend: openai\n"
        "model: gpt-oss-120b\nbase_url: http://127.0.0.1:8000/v1\napi_key_env: JUDGE_KEY\n"
    )
    res = cli(
        "train",
        "--config-dir",
        str(tmp_path / "myconf"),
        "judge=vllm",
        "--cfg",
        "job",
        "--offline",  # no judge server behind the URL: not probed
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert "model: gpt-oss-120b" in res.stdout


def test_unknown_command_and_help(tmp_path):
    assert cli("frobnicate", cwd=tmp_path).returncode == 2
    res = cli("--help", cwd=tmp_path)
    assert res.returncode == 0 and "validate" in res.stdout


@pytest.mark.parametrize("command", ["train", "validate"])
def test_unknown_option_is_one_clear_line(tmp_path, command):
    res = cli(command, "backbone=llama-9000", cwd=tmp_path)
    assert res.returncode == 2 and "choose one of: " in res.stderr
    assert "qwen2.5-7b-instruct" in res.stderr and "tiny" in res.stderr
    assert "Traceback" not in res.stderr


# --- help for a terminal -----------------------------------------------------------------------

COMMAND_MODULES = {  # the commands whose help argparse writes: their sub-commands are found there
    "compare": "slca_exp.commands.compare",
    "restore": "slca_exp.commands.restore",
    "rollouts": "slca_exp.commands.rollouts",
    "rejudge": "slca_exp.commands.rejudge",
    "ui": "slca_exp.commands.ui",
    "data": "slca_exp.commands.data",
    "serve": "slca_exp.commands.serve",
    "eval": "slca_exp.commands.eval",
}
MARKUP = re.compile(
    r"``[^`]*``"  # an RST literal
    r"|:[a-z]+(?::[a-z]+)?:`[^`]*`"  # an RST role (:func:`x`, :py:mod:`x`)
    r"|`[^`\n]+`"  # interpreted text, or Markdown code
    r"|::$"  # a literal block follows
    r"|^\s*\.\. [a-z-]+::",  # a directive
    flags=re.MULTILINE,
)


def every_help_command() -> list[tuple[str, ...]]:
    """``()`` (slca-exp itself), every command of the usage, and every sub-command of those."""
    commands = re.findall(r"^\s*slca-exp (\w+)", USAGE, flags=re.MULTILINE)
    assert {"train", "validate", *COMMAND_MODULES} == set(commands), "a command has no entry here"
    found: list[tuple[str, ...]] = [(), *((c,) for c in commands)]
    for command, module in COMMAND_MODULES.items():
        parser = importlib.import_module(module)._parser()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found += [(command, sub) for sub in action.choices]
    return found


def exit_status(args: list[str]) -> int:
    """What the console script exits with (argparse's --help exits from inside some commands)."""
    try:
        return main(args)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def test_every_commands_help_is_plain_text_without_markup(capsys):
    helps = every_help_command()
    assert ("serve", "down") in helps and ("data", "synth") in helps
    marked = {}
    for command in helps:
        assert exit_status([*command, "--help"]) == 0, command
        out, err = capsys.readouterr()
        # the help is on stdout; stderr is not compared: a worker's other tests may log there
        # (an event loop's task collected during this one)
        assert out.startswith("usage:"), (command, err[-2000:])
        found = sorted({m.group(0) for m in MARKUP.finditer(out)})
        if found:
            marked[" ".join(["slca-exp", *command, "--help"])] = found
    assert marked == {}, f"reStructuredText or Markdown in a terminal's help: {marked}"
