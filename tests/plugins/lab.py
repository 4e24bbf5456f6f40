"""One lab's own judge, simulator, tracker and data source, and how a test reads what they saw.

``tests/plugins/lab_plugin.py`` registers each under the name ``lab`` (importing this module
registers nothing, so a test process can read the constants without changing the registries
other tests check). Each leaves evidence a test can read after the run:

- the data source (``data.kind=lab``) writes a tiny split of its own, one question asked again
  and again (:data:`QUESTION`, easy to learn in a few SFT steps), under
  ``<tracking.root>/lab-data/``; it refuses more than :data:`MAX_ROWS` rows (``data.rows``);
- the simulator (``simulator.backend=lab``) answers every call with :data:`ANSWER`;
- the judge (``judge.backend=lab``) rates every rollout :data:`RATING`;
- the tracker (``tracking.backends=[lab]``) writes what it receives to
  ``<tracking.root>/lab-tracker.jsonl`` (it keeps files, so the end-of-run plots come to it).

The judge and the simulator also append what they saw to the file ``$LAB_PLUGIN_LOG`` names,
one JSON object a line.
"""

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from slca_exp.config.paths import output_root
from slca_exp.core.problems import Problem
from slca_exp.data import domain
from slca_exp.data.rows import rl_row, sft_row
from slca_exp.data.sources import SPLITS, DataSource
from slca_exp.data.synthetic import RL_SCHEMA, SFT_SCHEMA
from slca_exp.judges.base import JudgeBase, JudgeResult, JudgeView, short_circuit_fields
from slca_exp.simulators.base import SimulatorBase, ToolResponse

NAME = "lab"
"""The name every entry of this plugin is registered under."""
LOG_ENV = "LAB_PLUGIN_LOG"
QUESTION = "[lab] What's the weather in Paris?"
ANSWER = json.dumps({"lab": "simulated", "city": "Paris", "temperature": 19.5})
RATING = 4
"""The judge's rating of every rollout: summary score (4 - 1) / 4 = 0.75."""
MAX_ROWS = 64


def note(kind: str, **fields) -> None:
    """Append one line to ``$LAB_PLUGIN_LOG`` (nothing when it is not set)."""
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as log:
            log.write(json.dumps({"kind": kind, **fields}) + "\n")


def read_notes(path: Path, kind: str) -> list[dict]:
    """The lines of one kind in a ``$LAB_PLUGIN_LOG`` file."""
    lines = path.read_text().splitlines() if path.is_file() else []
    return [entry for entry in map(json.loads, lines) if entry["kind"] == kind]


# --- the data source ---------------------------------------------------------------------------


def lab_rows(n: int, split: str) -> list[dict]:
    """``n`` copies of one weather question, in the row layout (``slca_exp/data/rows.py``)."""
    (tool,) = [t for t in domain.TOOLS if t.name == "get_weather"]
    call = {"name": tool.name, "arguments": {"city": "Paris"}}
    content = domain.respond(call["name"], call["arguments"])
    rows = []
    for index in range(n):
        row = rl_row(
            index=index,
            split=split,
            system=domain.SYSTEM_PROMPT,
            question=QUESTION,
            steps=[[call]],
            responses=[{**call, "content": content}],
            reply=domain.reply(call["name"], call["arguments"], content),
            schemas=[tool.schema],
        )
        rows.append({**row, "data_source": NAME})
    return rows


class LabSource(DataSource):
    """``data.kind=lab``: ``data.rows`` rows per split, written on first use."""

    generates = True

    def problems(self, data):
        if data.rows > MAX_ROWS:
            return [
                Problem(
                    "data.rows",
                    f"the lab split has at most {MAX_ROWS} rows (got {data.rows})",
                    f"set data.rows to at most {MAX_ROWS}",
                )
            ]
        return []

    def folder(self, config):
        return output_root(config.tracking) / "lab-data" / f"rows={config.data.rows}"

    def planned(self, config):
        return {split: self.folder(config) / f"lab-{split}.parquet" for split in SPLITS}

    def resolve(self, config):
        files = self.planned(config)
        if not all(path.is_file() for path in files.values()):
            self.folder(config).mkdir(parents=True, exist_ok=True)
            for split, path in files.items():
                rows = lab_rows(config.data.rows, split)
                if split == "sft":
                    table = pa.Table.from_pylist([sft_row(r) for r in rows], schema=SFT_SCHEMA)
                else:
                    table = pa.Table.from_pylist(rows, schema=RL_SCHEMA)
                pq.write_table(table, path)
        return files, []

    def recorded(self, config):
        return {"rows": config.data.rows, "question": QUESTION}

    def pending_note(self, config):
        if all(path.is_file() for path in self.planned(config).values()):
            return None
        return f"data: the lab split will be written in {self.folder(config)}"


# --- the simulator ------------------------------------------------------------------------------


class LabSimulator(SimulatorBase):
    """Answers every call with :data:`ANSWER`, here, without a server."""

    name = NAME
    remote = False

    def respond_batch(self, requests):
        for request in requests:
            note("simulator", tool=request.call.name, question=request.context.question)
        return self._count([ToolResponse(ANSWER, "ok", NAME) for _ in requests])

    @classmethod
    def describe_config(cls, cfg):
        return {"backend": NAME, "name": cfg.name, "answer": ANSWER}


# --- the judge -----------------------------------------------------------------------------------


class LabJudge(JudgeBase):
    """Rates every rollout :data:`RATING`, after the paper's short-circuits."""

    name = NAME
    remote = False

    def score(self, batch):
        results = []
        for request in batch:
            view = JudgeView.of(request)
            note("judge", question=view.question, tool_responses=list(view.tool_responses))
            results.append(self._short_circuit(view, request) or JudgeResult.rated(RATING))
        return self._count(results)

    async def ascore(self, batch):
        return self.score(batch)

    @classmethod
    def describe_config(cls, cfg):
        return {"backend": NAME, "name": cfg.name, "rating": RATING, **short_circuit_fields(cfg)}


# --- the tracker ---------------------------------------------------------------------------------


class LabTracker:
    """Writes the run's recipe, metrics, files and status to ``<root>/lab-tracker.jsonl``."""

    def __init__(self, tracking, run_name, redactor, resume_run_id):
        self.path = output_root(tracking) / "lab-tracker.jsonl"
        self.run_name = run_name

    def _write(self, event, **fields):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as out:
            out.write(json.dumps({"event": event, "run": self.run_name, **fields}) + "\n")

    def start(self, recipe, params):
        self._write("start", recipe=recipe.to_dict())

    def log_metrics(self, metrics, step):
        self._write("metrics", step=step, metrics=dict(metrics))

    def log_artifact(self, path, artifact_path=None):
        self._write("artifact", name=Path(path).name, folder=artifact_path)

    def finish(self, status):
        self._write("finish", status=status)


def tracker_events(root: Path) -> list[dict]:
    """Everything the lab tracker wrote under the tracking root ``root``."""
    return [json.loads(line) for line in (root / "lab-tracker.jsonl").read_text().splitlines()]


# --- the counter engine (tests/plugins/engine_plugin.py) ---------------------------------------

COUNTER_OPTION = """\
defaults:
  - /schema/engine_counter@_here_
  - _self_

name: counter
counter:
  steps: 3
"""
"""``conf/engine/counter.yaml`` of a user's config folder."""
UNLUCKY = 13.0
"""The value the engine's own check refuses."""
