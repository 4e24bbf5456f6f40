"""What a user runs before a submission (``--cfg``, ``validate``, ``--dry-run``, ``--help``), typed
as a user types them: each command's exit status, its output, and that it creates nothing.

Every command runs as a subprocess of the installed console script, each in a launch folder of
its own that must stay empty; they start together (one fixture) so that their Python start-ups
overlap. No SLURM is consulted (a failing ``sinfo`` comes first on PATH, and an ``sbatch`` that
only leaves a mark) and the Hugging Face cache is empty, so the answers are the same on every
machine.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from slca_exp.config.schema import RunConfig
from slca_exp.launch.dry_run import hydra_launcher
from slca_exp.preflight import probe_services, unreachable
from slca_exp.preflight.compose import CONFIG_DIR
from slca_exp.preflight.keys import field_names, schema_at, unknown_path_problem
from slca_exp.preflight.sections import url_credentials
from slca_exp.services.loopback import Behaviour, serve_in_thread
from tests.planted import PLANTED, SECRET, SECRET_ENV

EXE = shutil.which("slca-exp") or str(Path(sys.executable).parent / "slca-exp")
PACKAGE = Path(__file__).resolve().parents[1] / "slca_exp"

TYPO = """\
defaults:
  - /schema/judge@_here_
  - _self_
name: vllm-judge
backend: openai
model: gpt-oss-120b
base_url: http://127.0.0.1:8000/v1
temprature: 0.2
"""

CONFIG_PATH = ["--config-path", str(CONFIG_DIR)]  # a primary config folder of the user's own

COMMANDS = {
    # a profile that submits, and a ready study, with --cfg (Hydra refuses --cfg with -m)
    "cfg_slurm": ["train", "--cfg", "job", "launcher=slurm_cpu"],
    "cfg_submitit_local": ["train", "--cfg", "job", "launcher=submitit_local"],
    "cfg_study": ["train", "--cfg", "job", "-m", "sweep=reward_weights"],
    # --cfg prints the composed config whatever its values, as Hydra does, and submits nothing
    "cfg_invalid": ["train", "--cfg", "job", "experiment=paper_7b"],
    "cfg_config_path": ["train", "--cfg", "job", *CONFIG_PATH, "launcher=slurm_cpu"],
    "cfg_config_path_sweep": ["train", "--cfg", "job", "-m", *CONFIG_PATH, "seed=1,2"],
    # what train refuses, validate refuses
    "toucan": ["validate", "data=toucan"],
    # a list of values without -m
    "list": ["validate", "reward.tool_weights.name=0.25,0.15", "reward.normalize=true"],
    # the launcher chosen the README's way
    "hydra_launcher": ["train", "--dry-run", "-m", "hydra/launcher=submitit_slurm", "seed=1,2"],
    # help and usage
    "validate_help": ["validate", "--help"],
    "no_arguments": [],
    "train_help": ["train", "--help"],
    # a typo in the user's own option file
    "typo": ["validate", "hydra.searchpath=[file://myconf]", "judge=vllm"],
    # credentials in a URL; a secret resolved into the printed config
    "credentials": ["validate", "judge=openai", "judge.base_url=http://u:secret@host/v1"],
    "cfg_secret": ["train", "--cfg", "job", "--resolve", *PLANTED],
}


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Every command's result and launch folder, the commands run side by side."""
    base = tmp_path_factory.mktemp("preflight")
    tools = base / "tools"
    tools.mkdir()
    (tools / "sinfo").write_text("#!/bin/sh\nexit 1\n")
    (tools / "sbatch").write_text(f"#!/bin/sh\ntouch {tools / 'sbatch-was-called'}\nexit 1\n")
    for tool in ("sinfo", "sbatch"):
        (tools / tool).chmod(0o755)
    drop = ("SLCA_EXP_ROOT", "MLFLOW_TRACKING_URI", "SLURM_PARTITION")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        PATH=f"{tools}{os.pathsep}{env['PATH']}",
        HF_HOME=str(base / "no-hf-cache"),
        **{SECRET_ENV: SECRET},
    )
    started = {}
    for name, args in COMMANDS.items():
        work = base / name
        (work / "myconf" / "judge").mkdir(parents=True)
        (work / "myconf" / "judge" / "vllm.yaml").write_text(TYPO)
        started[name] = (
            work,
            subprocess.Popen(
                [EXE, *args],
                cwd=work,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
    results = {}
    for name, (work, process) in started.items():
        out, err = process.communicate(timeout=300)
        results[name] = (process.returncode, out, err)
        assert sorted(p.name for p in work.iterdir()) == ["myconf"], f"{name} created files"
        assert "Traceback" not in out + err, f"{name}: {err}"
    assert not (tools / "sbatch-was-called").exists()  # nothing was submitted
    return results


def test_cfg_job_works_with_every_launcher_and_with_a_sweep(ran):
    for name in ("cfg_slurm", "cfg_submitit_local"):
        status, out, err = ran[name]
        assert status == 0, err
        assert "backbone:" in out and "tracking:" in out and "seed: 42" in out
    status, out, err = ran["cfg_study"]
    assert status == 0, err
    headers = re.findall(r"^# job #(\d+): (.*)$", out, re.MULTILINE)
    assert [int(i) for i, _ in headers] == list(range(9))  # the study's 3 x 3 grid
    assert all("reward.tool_weights.parallel=" in overrides for _, overrides in headers)
    assert out.count("\nbackbone:") == 9


def test_cfg_job_prints_the_config_of_an_invalid_recipe_and_its_problems_apart(ran):
    status, out, err = ran["cfg_invalid"]
    assert status == 2
    # stdout: the composed config, whatever its values (paper_7b leaves data.dir to the user)
    assert out.startswith("backbone:\n  name: qwen2.5-7b-instruct\n")
    assert "\ndata:\n" in out and "  dir: null\n" in out and "\ntracking:\n" in out
    assert "slca-exp:" not in out
    # stderr: the recipe's problems, and nothing of the config
    assert err.startswith("slca-exp: the recipe is invalid (1 problem):\n  data.dir: ")
    assert "backbone:" not in err


def test_cfg_job_with_config_path_and_a_submitting_launcher_prints_and_submits_nothing(ran):
    status, out, err = ran["cfg_config_path"]
    assert status == 0, err
    assert out.startswith("backbone:\n") and "\nseed: 42\n" in out
    assert "Only one of" not in err  # Hydra's refusal of --cfg with -m
    assert "submitted" not in out + err  # and the fixture saw no sbatch call
    status, out, err = ran["cfg_config_path_sweep"]
    assert status == 2 and out == ""
    assert "  -m: --cfg prints one config, and with --config-path" in err
    assert "fix: drop -m and give one value per key" in err


def test_validate_refuses_what_train_refuses(ran):
    status, out, err = ran["toucan"]
    assert status == 2 and "data.dir: data=toucan needs the folder" in err
    assert "valid" not in out


def test_a_list_without_multirun_is_refused_at_once(ran):
    status, _, err = ran["list"]
    assert status == 2
    assert "reward.tool_weights.name: 0.25,0.15 is a list of values to sweep over" in err
    assert "add -m" in err


def test_the_dry_run_describes_the_launcher_chosen_with_hydra_launcher(ran):
    status, out, err = ran["hydra_launcher"]
    assert status == 0, err
    assert "dry run of 2 jobs with hydra/launcher=submitit_slurm (submitit_slurm)" in out
    assert "runs here" not in out
    script = out.split("sbatch script:\n", 1)[1]
    assert "#SBATCH --array=0-1%2" in script and "#SBATCH --time=60" in script


def test_help_of_each_command_and_usage_without_arguments(ran):
    status, out, _ = ran["validate_help"]
    assert status == 0 and out.startswith("usage: slca-exp validate")
    assert "slca-exp: the recipe is" not in out  # it explains, it does not validate
    status, out, err = ran["no_arguments"]
    assert status != 0 and out == "" and "slca-exp train" in err
    status, out, _ = ran["train_help"]
    assert status == 0 and "--dry-run" in out and "--offline" in out
    groups = out.split("config groups:\n", 1)[1]
    assert "  judge: openai, rubric" in groups and "schema" not in groups


def test_a_typo_in_a_users_option_file_names_the_file_line_and_the_right_key(ran):
    status, _, err = ran["typo"]
    assert status == 2
    line = 1 + TYPO.splitlines().index("temprature: 0.2")
    assert f"myconf/judge/vllm.yaml:{line}" in err
    assert "did you mean judge.temperature?" in err


def test_credentials_in_a_url_are_refused_and_never_printed(ran):
    status, out, err = ran["credentials"]
    assert status == 2
    assert "judge.base_url: carries credentials (user:password@)" in err
    assert "judge.api_key_env=" in err and "u:secret" not in out + err
    status, out, err = ran["cfg_secret"]
    assert status == 0, err
    assert "name: <redacted>" in out and SECRET not in out + err


def test_no_message_or_shipped_config_cites_a_file_users_do_not_have():
    # The design notes and the method's notes live outside the package; the README and docs/
    # are what a user has.
    private = re.compile(r"\b(?:REFERENCE|DESIGN|STYLE)\.md\b")
    docs = [PACKAGE.parent / "README.md", *(PACKAGE.parent / "docs").glob("*.md")]
    shipped = [
        p
        for p in [*PACKAGE.rglob("*.py"), *CONFIG_DIR.rglob("*.yaml"), *PACKAGE.rglob("*.txt")]
        if "__pycache__" not in p.parts
    ] + [p for p in docs if p.is_file()]
    assert len(shipped) > 100
    cited = [str(p) for p in shipped if private.search(p.read_text())]
    assert cited == []


# --- the pieces, over random inputs ------------------------------------------------------------


def _paths(schema: type = RunConfig, prefix: str = "") -> list[str]:
    """Every dotted key of the schema, at every depth."""
    out = []
    for name in field_names(schema):
        key = f"{prefix}{name}"
        out.append(key)
        sub = schema_at(key)
        if sub is not None:
            out += _paths(sub, f"{key}.")
    return out


KEYS = [k for k in _paths() if all(len(part) >= 5 for part in k.split("."))]


@given(st.sampled_from(KEYS), st.data())
def test_a_typo_at_any_depth_is_answered_with_the_key_meant(key, data):
    parts = key.split(".")
    depth = data.draw(st.integers(0, len(parts) - 1))
    word = parts[depth]
    at = data.draw(st.integers(0, len(word) - 1))
    typo = word[:at] + word[at + 1 :]  # one letter dropped
    # dropping a letter must not make another key of the same mapping
    assume(typo not in field_names(schema_at(".".join(parts[:depth]))))
    wrong = ".".join([*parts[:depth], typo, *parts[depth + 1 :]])
    problem = unknown_path_problem(wrong)
    assert problem.key == wrong
    assert f"has no {typo!r}" in problem.what
    if f"did you mean {key}?" not in problem.fix:  # another key may be closer still
        close = problem.fix.split("did you mean ", 1)[1].split("?")[0]
        assert close.split(".")[:depth] == parts[:depth] and close != wrong


@given(
    st.sampled_from(["http", "https"]),
    st.from_regex(r"[a-z]{1,8}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9._~-]{1,12}", fullmatch=True),
    st.sampled_from(["api_key", "token", "access_token", "password", "sig", "key"]),
)
def test_credentials_are_found_in_any_url(scheme, user, secret, name):
    assert url_credentials(f"{scheme}://{user}:{secret}@host:8000/v1") == "user:password@"
    assert url_credentials(f"{scheme}://host/v1?x=1&{name}={secret}") == (
        f"the query parameter {name}"
    )
    assert url_credentials(f"{scheme}://{user}.example.org:8000/v1?model={secret}") is None


def test_the_probe_finds_a_server_whatever_it_answers_and_names_a_missing_one():
    with serve_in_thread(route=lambda request: Behaviour(status=404)) as server:
        assert unreachable(server.base_url) is None  # an HTTP answer, even 404, is a server
        dead = server.base_url
    assert "refused" in (unreachable(dead, timeout_s=2) or "").lower()

    class Service:
        backend, base_url = "openai", dead

    class Local:
        backend, base_url = "replay", dead  # in-process: not probed

    class Config:
        judge, simulator = Service(), Local()

    (problem,) = probe_services([Config(), Config()])  # one probe per URL
    assert problem.key == "judge.base_url" and dead in problem.what
    assert "--offline" in problem.fix


def test_hydra_launcher_is_read_back_as_a_profile(monkeypatch, tmp_path):
    (tmp_path / "sinfo").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert hydra_launcher(["seed=1"], "config") is None
    name, profile, problems = hydra_launcher(
        ["hydra/launcher=submitit_slurm", "hydra.launcher.gpus_per_node=2"], "config"
    )
    assert problems == [] and profile.kind == "submitit_slurm"
    assert (profile.gpus_per_node, profile.gpu, profile.timeout_min) == (2, True, 60)
    _, local, _ = hydra_launcher(["hydra/launcher=submitit_local"], "config")
    assert local.kind == "submitit_local" and name.startswith("hydra/launcher=submitit_slurm")


@pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="needs the verl extra")
def test_checks_that_only_look_build_no_checkpoint_and_generate_no_split(tmp_path):
    from slca_exp.core.checking import creating_nothing
    from slca_exp.engines.verl.translation import model_path
    from slca_exp.preflight import pending_notes
    from slca_exp.preflight.compose import compose_run
    from slca_exp.preflight.validate import validate
    from slca_exp.recipe import build_recipe

    config = validate(compose_run(["engine=verl", f"tracking.root={tmp_path}"]))
    with creating_nothing():
        assert model_path(config).startswith("<built at launch under ")
        assert build_recipe(config).data["files"] == {}
    (note,) = pending_notes(config)
    assert "will be generated in" in note and str(tmp_path) in note
    assert list(tmp_path.iterdir()) == []
