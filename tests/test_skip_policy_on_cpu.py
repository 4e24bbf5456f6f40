"""Under CI a skip that is not on the allow-list fails the run, naming its reason.

Each case runs pytest in a subprocess, as ``make test`` does, once with ``CI=true`` and once
without: a verl that raises ``ImportError`` on import, a verl whose submodules are gone (the way
a moved module looks), and a test or module that skips for a reason nobody listed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.skip_policy import ALLOWED_FILE, allowed_reasons, skip_reason

ROOT = Path(__file__).resolve().parent.parent
VERL_FILES = ("tests/estimators/test_verl_parity.py", "tests/engines/verl/test_sft_on_cpu.py")
"""Two verl test files: one imports a verl submodule at the top, one verl itself."""
NEVER_ALLOWED = ("verl", "slurm", "chromium", "mlflow")
"""What CI provisions: no allowed skip reason may be about one of these."""


def pytest_in(folder: Path, *args: str, ci: bool, pythonpath: Path | None = None):
    """``python -m pytest ARGS`` from ``folder`` with the skip policy; CI on or off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CI"))}
    if ci:
        env["CI"] = "true"
    paths = [str(pythonpath)] if pythonpath else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT)])
    command = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*command, "-p", "tests.skip_policy", "-rs", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def fake_verl(folder: Path, body: str) -> Path:
    """A ``verl`` package in ``folder`` (put first on the path) whose ``__init__`` is ``body``."""
    (folder / "verl").mkdir(parents=True)
    (folder / "verl" / "__init__.py").write_text(body)
    return folder


@pytest.mark.slow
def test_a_verl_that_fails_to_import_fails_the_verl_files_under_ci_naming_verl(tmp_path):
    broken = fake_verl(tmp_path, "raise ImportError('libsomething.so: cannot open shared object')")
    run = pytest_in(ROOT, "-o", "addopts=", *VERL_FILES, ci=True, pythonpath=broken)
    out = run.stdout + run.stderr
    assert run.returncode not in (0, 5), out[-3000:]
    assert "skipped" not in out.splitlines()[-1], out[-3000:]
    assert "'verl'" in out and "libsomething.so" in out, out[-3000:]


@pytest.mark.slow
def test_a_moved_verl_module_fails_under_ci_and_skips_outside(tmp_path):
    hollow = fake_verl(tmp_path, "")  # imports, but verl.trainer... is not there
    ci = pytest_in(ROOT, "-o", "addopts=", *VERL_FILES, ci=True, pythonpath=hollow)
    out = ci.stdout + ci.stderr
    assert ci.returncode not in (0, 5), out[-3000:]
    assert "verl.trainer.ppo.core_algos" in out, out[-3000:]
    laptop = pytest_in(ROOT, "-o", "addopts=", VERL_FILES[0], ci=False, pythonpath=hollow)
    last = (laptop.stdout + laptop.stderr).strip().splitlines()[-1]
    # exit 5: pytest ran no test (the file's one module skipped)
    assert laptop.returncode == 5 and "1 skipped" in last and "failed" not in last, last


SKIPPING = """
import pytest

pytest.skip({module!r}, allow_module_level=True) if {module!r} else None


def test_unlisted():
    pytest.skip("nobody listed this reason")


@pytest.mark.skipif(True, reason={allowed!r})
def test_listed():
    pass


def test_passes():
    pass
"""


@pytest.mark.parametrize("module_reason", ["", "a module skipped for a reason nobody listed"])
def test_an_unlisted_skip_reason_fails_under_ci_and_a_listed_one_stays_a_skip(
    tmp_path, module_reason
):
    allowed = sorted(allowed_reasons())[0]
    test = tmp_path / "test_skips.py"
    test.write_text(SKIPPING.format(module=module_reason, allowed=allowed))
    ci = pytest_in(tmp_path, "-o", "addopts=", test.name, ci=True)
    out = ci.stdout + ci.stderr
    assert ci.returncode in (1, 2), out  # 2: a module that fails at collection stops the run
    reason = module_reason or "nobody listed this reason"
    assert f"skipped under CI for a reason not on the allow-list: {reason!r}" in out, out
    assert ALLOWED_FILE.name in out
    last = out.strip().splitlines()[-1]
    if module_reason:  # the whole module is one collection error
        assert "1 error" in last and "passed" not in last, last
    else:
        assert "1 failed" in last and "1 passed" in last and "1 skipped" in last, last
    laptop = pytest_in(tmp_path, "-o", "addopts=", test.name, ci=False)
    last = (laptop.stdout + laptop.stderr).strip().splitlines()[-1]
    assert laptop.returncode in (0, 5) and "failed" not in last, last  # 5: nothing ran


def test_the_allow_list_is_short_and_lets_no_provided_component_skip():
    reasons = allowed_reasons()
    assert 0 < len(reasons) <= 5, reasons
    for reason in reasons:
        assert not any(name in reason.lower() for name in NEVER_ALLOWED), reason
    # every reason comes with a '#' line saying why, right above it
    lines = ALLOWED_FILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip() in reasons:
            assert i > 0 and lines[i - 1].startswith("#"), line


@pytest.mark.parametrize(
    ("longrepr", "reason"),
    [
        (("f.py", 3, "Skipped: needs a GPU"), "needs a GPU"),
        ("Skipped: plain", "plain"),
        (("f.py", 3, "no prefix"), "no prefix"),
    ],
)
def test_skip_reasons_are_read_off_both_report_shapes(longrepr, reason):
    assert skip_reason(longrepr) == reason
