"""Where a run's logged rollouts are kept among its artifacts, and reading them back.

    rollouts/<split>/step_<NNNNNN>.jsonl   the records, one JSON object per line (what the
                                           ``rollouts`` command and the credit view read)
    rollouts/<split>/step_<NNNNNN>.json    the rollouts as a table (``mlflow.log_table``'s format)
    rollouts/<split>/step_<NNNNNN>.html    the credit view of the step

``<split>`` is ``train`` (an RL step's sampled rollouts) or ``val`` (a validation's).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from slca_exp.rollouts.record import SPLITS, RolloutRecord

ARTIFACT_DIR = "rollouts"
RECORDS = "jsonl"
TABLE = "json"
VIEW = "html"
_NAME = re.compile(r"^step_(\d+)\.(jsonl|json|html)$")


def folder(split: str) -> str:
    """``rollouts/<split>``: the artifact folder of one split's files."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: use one of {', '.join(SPLITS)}")
    return f"{ARTIFACT_DIR}/{split}"


def file_name(step: int, kind: str) -> str:
    """``step_<NNNNNN>.<kind>`` (kind: ``jsonl`` records, ``json`` table, ``html`` view)."""
    if kind not in (RECORDS, TABLE, VIEW):
        raise ValueError(f"kind={kind!r}: use {RECORDS}, {TABLE} or {VIEW}")
    return f"step_{int(step):06d}.{kind}"


def artifact_path(split: str, step: int, kind: str) -> str:
    """``rollouts/<split>/step_<NNNNNN>.<kind>``."""
    return f"{folder(split)}/{file_name(step, kind)}"


def step_of(name: str) -> int | None:
    """The step a file name holds (``step_000010.jsonl`` -> 10); None for other names."""
    found = _NAME.match(Path(name).name)
    return int(found.group(1)) if found else None


def write_records(records: Iterable[RolloutRecord], path: Path) -> Path:
    """Write ``records`` as JSON lines to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r.to_json() + "\n" for r in records), encoding="utf-8")
    return path


def read_records(path: Path) -> Iterator[RolloutRecord]:
    """The records of a ``.jsonl`` file, in order.

    Raises:
        ValueError: a line is not a record (the message names the file and the line).

    """
    import json

    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield RolloutRecord.from_dict(json.loads(line))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}, line {number}: not a rollout record ({err})") from err
