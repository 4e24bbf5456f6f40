"""Under CI a test may skip only for a reason on the reviewed allow-list; any other skip fails.

A skip hides what it skips: a verl that no longer imports, or a module verl moved, turns every
verl test into a skip, and a suite of skips passes. So when ``CI`` is set (what ``.ci/run`` runs
under), every skip, of a test or of a whole module at collection, is checked against
:data:`ALLOWED_FILE`: a reason listed there word for word stays a skip, any other becomes a
failure that names the reason and the file. Outside CI, skips stay as they are (a laptop without
SLURM or Chromium runs the rest). An expected failure (``xfail``) is not a skip and is left alone.

:func:`require` is ``pytest.importorskip`` with the same rule made explicit: under CI it imports
the module for real, and a module that is missing or fails to import fails the file, showing the
import's own error.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import pytest

ALLOWED_FILE = Path(__file__).with_name("ci_allowed_skips.txt")
"""One allowed skip reason a line, exactly as the test gives it; ``#`` lines say why."""


def in_ci() -> bool:
    """Whether this run is a CI run (``CI`` set to anything but empty, ``0`` or ``false``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def allowed_reasons(path: Path = ALLOWED_FILE) -> frozenset[str]:
    """The skip reasons the allow-list names (blank and ``#`` lines are not reasons)."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return frozenset(line for line in lines if line and not line.startswith("#"))


def require(module: str, *, reason: str) -> ModuleType:
    """``module``, imported; outside CI a skip with ``reason`` when it cannot be imported.

    Under CI there is no skip to allow: the import runs as it is, and its error (a missing
    package, a module the dependency moved, an ``ImportError`` inside it) fails the test file.
    """
    if not in_ci():
        return pytest.importorskip(module, reason=reason)
    try:
        return importlib.import_module(module)
    except ImportError as err:
        pytest.fail(
            f"CI needs {module!r} ({reason}), but importing it failed: {type(err).__name__}: {err}",
            pytrace=False,
        )


def skip_reason(longrepr: object) -> str:
    """The reason of a skip report (``(path, line, 'Skipped: reason')``, or the text itself)."""
    message = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr
    return str(message).removeprefix("Skipped: ")


def _refuse(report: pytest.CollectReport | pytest.TestReport) -> None:
    """Turn ``report``'s skip into a failure when CI is on and its reason is not allowed."""
    if not (report.skipped and in_ci()) or hasattr(report, "wasxfail"):
        return
    reason = skip_reason(report.longrepr)
    if reason in allowed_reasons():
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under CI for a reason not on the allow-list: {reason!r}\n"
        f"Under CI a skip must not hide a missing component: install what the test needs "
        f"(.ci/run provisions the services), or, for a reason that cannot hold on a CI "
        f"machine (e.g. a GPU), add it word for word to {ALLOWED_FILE.parent.name}/"
        f"{ALLOWED_FILE.name} with a '#' line saying why."
    )


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport:
    """A module that skips at collection (``importorskip``, ``allow_module_level``)."""
    report = yield
    _refuse(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """A test that skips in its set-up (``skipif``, a fixture) or its body."""
    report = yield
    _refuse(report)
    return report
