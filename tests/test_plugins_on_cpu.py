"""A plugin's judge, simulator, tracker and data source, picked by name from the command line.

``tests/plugins/lab_plugin.py`` registers one of each as ``lab`` through ``SLCA_EXP_PLUGINS``.
``slca-exp validate`` accepts the names, asks the plugin's data source for its own problems and
notes, and refuses a misspelt name naming its key and the registered names. ``slca-exp train``
runs all four at once on the local engine (a short SFT on the lab split, one RL step), and each
leaves its evidence: the split the source wrote is the one the rollouts asked, the simulator's
answer is in the tool responses the judge saw, the judge's rating is the summary reward of every
rollout, and the tracker received the recipe, every step, the plots and the final status.
"""

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from slca_exp.core import names
from tests.plugins import lab

EXE = shutil.which("slca-exp") or str(Path(sys.executable).parent / "slca-exp")
REPO = Path(__file__).resolve().parents[1]

LAB = [
    "data.kind=lab",
    "data.name=lab",
    "judge.backend=lab",
    "judge.name=lab",
    "simulator.backend=lab",
    "simulator.name=lab",
    "tracking.backends=[lab]",
]
"""The four plugin entries, picked by name."""

CHEAP = [
    "data.rows=8",
    "engine.sft.steps=40",
    "engine.sft.batch_size=8",
    "engine.sft.lr=5e-3",
    "engine.rl.steps=1",
    "engine.rollout.prompts_per_step=2",
    "engine.rollout.max_turns=1",
    "algorithm.group_size=2",
    "engine.val_rows=2",
    "engine.progress=false",
    # Every rollout goes to the judge, so every summary reward is the judge's own rating.
    "judge.short_circuit_no_tool_response=false",
    "judge.min_reply_chars=0",
]
"""The smallest run that still learns the call, rolls out, simulates, judges and logs."""


def slca_exp(*args, cwd, log=None, timeout=120):
    """``slca-exp *args`` with the lab plugin, as a user runs it (a subprocess)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLCA_EXP_PLUGINS": "tests.plugins.lab_plugin"}
    for var in ("SLCA_EXP_PARENT_RUN_ID", "SLCA_EXP_SWEEP_ID", "RANK", "MLFLOW_TRACKING_URI"):
        env.pop(var, None)
    if log is not None:
        env[lab.LOG_ENV] = str(log)
    return subprocess.run(
        [EXE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def problem_line(stderr: str, key: str) -> str:
    """The one line of a refusal that reports ``key``."""
    (line,) = [ln.strip() for ln in stderr.splitlines() if ln.strip().startswith(f"{key}: ")]
    return line


# --- validate: no training ---------------------------------------------------------------------


def test_validate_accepts_the_plugins_names_and_reports_what_its_source_would_write(tmp_path):
    res = slca_exp(
        "validate", *LAB, "data.rows=8", f"tracking.root={tmp_path / 'out'}", cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    assert (
        f"the lab split will be written in {tmp_path / 'out' / 'lab-data' / 'rows=8'}" in res.stdout
    )
    assert "the recipe is valid (1 job)" in res.stdout
    assert list(tmp_path.iterdir()) == []


def test_validate_refuses_misspelt_names_naming_the_key_and_the_registered_ones(tmp_path):
    res = slca_exp(
        "validate",
        "judge.backend=lba",
        "simulator.backend=lap",
        "data.kind=labb",
        "tracking.backends=[console,lob]",
        cwd=tmp_path,
    )
    assert res.returncode == 2
    assert "the recipe is invalid (4 problems)" in res.stderr
    for key, known in (
        ("judge.backend", "Known judges: lab, openai, rubric"),
        ("simulator.backend", "Known simulators: lab, replay, sgls"),
        ("data.kind", "Known data sources: files, lab, synthetic"),
        ("tracking.backends[1]", "Known trackers: console, lab, mlflow, wandb"),
    ):
        line = problem_line(res.stderr, key)
        assert "Did you mean 'lab'?" in line and known in line, line
    assert res.stderr.count("$SLCA_EXP_PLUGINS") == 4  # each fix says how a plugin adds one
    assert list(tmp_path.iterdir()) == []


def test_validate_reports_the_plugin_sources_own_problem_with_its_key(tmp_path):
    res = slca_exp("validate", *LAB, f"data.rows={lab.MAX_ROWS + 1}", cwd=tmp_path)
    assert res.returncode == 2
    assert "the recipe is invalid (1 problem)" in res.stderr
    assert f"at most {lab.MAX_ROWS} rows" in problem_line(res.stderr, "data.rows")


# --- train: all four at once on the local engine -----------------------------------------------


@dataclass(frozen=True)
class LabRun:
    """What one ``slca-exp train`` with the four lab entries left behind."""

    root: Path
    events: list[dict]
    judged: list[dict]
    simulated: list[dict]

    def recipe(self) -> dict:
        """The recipe the tracker received when the run started."""
        return self.events[0]["recipe"]

    def metrics(self, name: str) -> list[float]:
        """Every value of one metric the tracker received, in order."""
        return [e["metrics"][name] for e in self.events if name in e.get("metrics", {})]


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lab-run")
    root, log = folder / "out", folder / "lab.log"
    res = slca_exp(
        "train",
        *LAB,
        *CHEAP,
        f"tracking.root={root}",
        f"hydra.run.dir={folder / 'hydra'}",
        cwd=folder,
        log=log,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return LabRun(
        root,
        lab.tracker_events(root),
        lab.read_notes(log, "judge"),
        lab.read_notes(log, "simulator"),
    )


@pytest.mark.slow
def test_the_plugin_tracker_receives_the_recipe_every_step_the_plots_and_the_status(lab_run):
    events = lab_run.events
    assert [events[0]["event"], events[-1]["event"]] == ["start", "finish"]
    assert events[-1]["status"] == "FINISHED"
    recipe = lab_run.recipe()
    assert (recipe["judge"]["backend"], recipe["simulator"]["backend"]) == ("lab", "lab")
    assert recipe["data"]["kind"] == "lab"
    assert lab_run.metrics(names.SFT_LOSS) and lab_run.metrics(names.REWARD_TOTAL_MEAN)
    # The tracker keeps files, so the end-of-run plots come to it.
    plots = [e["name"] for e in events if e["event"] == "artifact" and e["folder"] == "plots"]
    assert plots and all(name.endswith(".png") for name in plots)


@pytest.mark.slow
def test_the_plugin_source_wrote_the_split_the_run_recorded_and_rolled_out(lab_run):
    data = lab_run.recipe()["data"]
    folder = lab_run.root / "lab-data" / "rows=8"
    assert {split: f["path"] for split, f in data["files"].items()} == {
        split: str(folder / f"lab-{split}.parquet") for split in ("sft", "train", "val")
    }
    assert (data["rows"], data["question"]) == (8, lab.QUESTION)  # the fields it records
    assert lab_run.judged and {j["question"] for j in lab_run.judged} == {lab.QUESTION}


@pytest.mark.slow
def test_the_plugin_simulator_answered_the_calls_and_its_answer_is_in_the_rollouts(lab_run):
    assert lab_run.simulated
    assert {(s["tool"], s["question"]) for s in lab_run.simulated} == {
        ("get_weather", lab.QUESTION)
    }
    assert any(lab.ANSWER in j["tool_responses"] for j in lab_run.judged)
    assert 0 < sum(lab_run.metrics(names.SIMULATOR_REQUESTS)) <= len(lab_run.simulated)


@pytest.mark.slow
def test_the_plugin_judges_rating_is_every_summary_reward(lab_run):
    assert sum(lab_run.metrics(names.JUDGE_REQUESTS)) > 0
    summaries = lab_run.metrics(names.REWARD_SUMMARY_MEAN)
    assert summaries and all(s == (lab.RATING - 1) / 4 for s in summaries)
