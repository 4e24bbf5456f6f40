"""A local JSONL spool for metric steps a tracking server could not take.

While the MLflow server is unreachable, each step is appended to a file (one JSON object per
line: step, timestamp in ms, metrics); when the server answers again, or at finish, the lines are
replayed in order. A step keeps the timestamp it got when it was first logged, so replaying a
step the server did store (its answer was lost) writes the very same rows, which MLflow's store
deduplicates: every step ends up present exactly once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StepRecord:
    """One step's metrics as first logged.

    Attributes:
        step: training step.
        timestamp_ms: wall-clock time of the first attempt, milliseconds since the epoch.
        metrics: metric name -> value.

    """

    step: int
    timestamp_ms: int
    metrics: Mapping[str, float]

    def to_json(self) -> str:
        """One JSONL line (without the newline)."""
        return json.dumps(
            {"step": self.step, "timestamp_ms": self.timestamp_ms, "metrics": dict(self.metrics)}
        )

    @classmethod
    def from_json(cls, line: str) -> StepRecord:
        """Parse a line written by :meth:`to_json`."""
        data = json.loads(line)
        return cls(int(data["step"]), int(data["timestamp_ms"]), data["metrics"])


class Spool:
    """An append-only file of :class:`StepRecord` waiting to be sent.

    Args:
        path: the JSONL file; created on the first append, removed once fully replayed.

    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._pending = self._count_lines()

    def __len__(self) -> int:
        return self._pending

    def append(self, record: StepRecord) -> None:
        """Add a step; flushed and fsynced, so a crash right after keeps it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(record.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._pending += 1

    def records(self) -> Iterator[StepRecord]:
        """The waiting steps, oldest first."""
        if not self.path.exists():
            return
        with self.path.open() as f:
            for line in f:
                if line.strip():
                    yield StepRecord.from_json(line)

    def replay(self, send: Callable[[StepRecord], None]) -> int:
        """Send every waiting step in order; returns how many were sent.

        Stops at the first failure (its exception propagates) and keeps the unsent steps, so a
        later replay resumes where this one stopped. Steps already sent may be sent again if
        the spool cannot be rewritten; that is safe (see the module docstring).
        """
        records = list(self.records())
        sent = 0
        try:
            for record in records:
                send(record)
                sent += 1
        finally:
            self._rewrite(records[sent:])
        return sent

    def _rewrite(self, remaining: list[StepRecord]) -> None:
        if not remaining:
            self.path.unlink(missing_ok=True)
        else:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(r.to_json() + "\n" for r in remaining))
            tmp.replace(self.path)
        self._pending = len(remaining)

    def _count_lines(self) -> int:
        if not self.path.exists():
            return 0
        with self.path.open() as f:
            return sum(1 for line in f if line.strip())
