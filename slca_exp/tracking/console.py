"""The console tracker: a compact table on stdout every N steps, nothing on disk.

Also :func:`mirrored_to_job_log`: the ``slca-exp:`` lines a job prints, on stdout or stderr,
copied into the job's Hydra log file (``train.log``) as they are printed, the console unchanged.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from slca_exp.core import names
from slca_exp.core.tags import short
from slca_exp.tracking.base import Status

if TYPE_CHECKING:
    from slca_exp.recipe import Recipe

COLUMNS: tuple[tuple[str, str], ...] = (
    (names.REWARD_TOTAL_MEAN, "R_total"),
    (names.REWARD_TOOL_MEAN, "R_tool"),
    (names.REWARD_SUMMARY_MEAN, "R_sum"),
    (names.adv("tool", "abs_mean"), "|A_tool|"),
    (names.adv("summary", "abs_mean"), "|A_sum|"),
    (names.present_frac("tool"), "tool_frac"),
    (names.TRAIN_LOSS, "loss"),
    (names.PERF_STEP_S, "s/step"),
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
        tags = " ".join(f"{short(k)}={v}" for k, v in recipe.tags().items())
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


LINE_PREFIX = "slca-exp:"
"""The lines :func:`mirrored_to_job_log` copies into the job's log file."""
JOB_LOGGER = "slca_exp.console"
"""The logger the copies go through: it writes to the job's log files only, never the console."""


@contextmanager
def mirrored_to_job_log(folder: str | Path | None = None) -> Iterator[None]:
    """Copy the ``slca-exp:`` lines printed inside the block into the Hydra job's log file.

    Hydra's job logging writes the root logger's records to ``<output folder>/train.log`` (a
    ``FileHandler``) and to the console. slca-exp's own lines are printed (progress, the
    closing block, errors), so this wraps ``sys.stdout`` and ``sys.stderr``: everything still
    goes to them byte for byte, and each complete line that starts with ``slca-exp:`` is also
    logged through :data:`JOB_LOGGER` to the root logger's file handlers of that folder only.

    Args:
        folder: the job's output folder; default Hydra's (outside a Hydra job nothing changes).

    """
    if folder is None:
        from slca_exp.tracking.closing import hydra_output_dir

        folder = hydra_output_dir()
    files = [
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.FileHandler)
        and folder is not None
        and Path(h.baseFilename).resolve().parent == Path(folder).resolve()
    ]
    if not files:
        yield
        return
    logger = logging.getLogger(JOB_LOGGER)
    logger.propagate = False  # the console already has the line
    logger.setLevel(logging.INFO)
    for handler in files:
        logger.addHandler(handler)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _LineTee(sys.stdout, logger), _LineTee(sys.stderr, logger)
    try:
        yield
    finally:
        for tee in (sys.stdout, sys.stderr):
            if isinstance(tee, _LineTee):
                tee.flush_line()
        sys.stdout, sys.stderr = saved
        for handler in files:
            logger.removeHandler(handler)


class _LineTee:
    """A text stream that writes through to ``stream`` and logs its ``slca-exp:`` lines."""

    def __init__(self, stream: TextIO, logger: logging.Logger) -> None:
        self._stream = stream
        self._logger = logger
        self._line = ""

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        self._line += text
        *lines, self._line = self._line.split("\n")
        for line in lines:
            self._log(line)
        return written

    def flush_line(self) -> None:
        """Log what is left of an unfinished line."""
        line, self._line = self._line, ""
        self._log(line)

    def _log(self, line: str) -> None:
        line = line.rsplit("\r", 1)[-1]  # a progress bar redraws its line with carriage returns
        if line.startswith(LINE_PREFIX):
            self._logger.info(line)

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401 - flush, fileno, isatty, encoding
        return getattr(self._stream, name)
