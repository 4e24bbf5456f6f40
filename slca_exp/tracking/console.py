"""The console tracker: a compact table on stdout every N steps, nothing on disk."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from slca_exp.tracking import names
from slca_exp.tracking.base import Status

if TYPE_CHECKING:
    from slca_exp.recipe import Recipe

COLUMNS: tuple[tuple[str, str], ...] = (
    ("reward/total/mean", "R_total"),
    ("reward/tool/mean", "R_tool"),
    ("reward/summary/mean", "R_sum"),
    (names.adv("tool", "abs_mean"), "|A_tool|"),
    (names.adv("summary", "abs_mean"), "|A_sum|"),
    (names.present_frac("tool"), "tool_frac"),
    ("train/loss", "loss"),
    ("perf/step_s", "s/step"),
)
"""(metric, column header) of the table; a column appears once a step has its metric."""

_WIDTH = 9
_HEADER_EVERY = 20


class ConsoleTracker:
    """Prints the recipe once, then one table row every ``every`` steps.

    Args:
        every: print a row for steps divisible by ``every`` (and the first one).
        stream: where to print (stdout by default).

    """

    def __init__(self, every: int = 10, stream: TextIO | None = None) -> None:
        self.every = every
        self.stream = stream
        self._columns: list[tuple[str, str]] | None = None
        self._rows = 0

    def start(self, recipe: Recipe, params: Mapping[str, Any]) -> None:
        """Print the recipe's tags."""
        tags = " ".join(f"{k.removeprefix('slca.')}={v}" for k, v in recipe.tags().items())
        self._print(f"slca-exp: {recipe.experiment_name} | {tags}")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Print a row when ``step`` is due."""
        if self._rows and step % self.every:
            return
        if self._columns is None:
            self._columns = [c for c in COLUMNS if c[0] in metrics]
        if self._rows % _HEADER_EVERY == 0:
            self._print(f"{'step':>7} " + " ".join(f"{h:>{_WIDTH}}" for _, h in self._columns))
        cells = " ".join(_cell(metrics.get(name)) for name, _ in self._columns)
        self._print(f"{step:>7} {cells}")
        self._rows += 1

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Nothing to print for a file."""

    def finish(self, status: Status) -> None:
        """Print the final status."""
        self._print(f"slca-exp: run {status}")

    def _print(self, line: str) -> None:
        print(line, file=self.stream or sys.stdout, flush=True)


def _cell(value: float | None) -> str:
    if value is None:
        return f"{'-':>{_WIDTH}}"
    if math.isfinite(value) and value != 0 and not 1e-3 <= abs(value) < 1e5:
        return f"{value:>{_WIDTH}.2e}"
    return f"{value:>{_WIDTH}.4f}"
