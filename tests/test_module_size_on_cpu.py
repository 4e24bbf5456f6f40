"""No module of slca_exp is over 450 lines.

A module past that holds two concerns: split it at the seam that is already there, not for the
number's sake. ``EXCEPTIONS`` names the modules allowed past the limit, each with its reason.
"""

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "slca_exp"
MAX_LINES = 450
EXCEPTIONS: dict[str, str] = {}
"""``slca_exp/<path>.py`` -> why it may be longer (none today)."""


def module_lines() -> dict[str, int]:
    return {
        path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_module_is_over_the_limit():
    lines = module_lines()
    assert len(lines) > 100  # the package was found
    over = {path: n for path, n in lines.items() if n > MAX_LINES and path not in EXCEPTIONS}
    assert over == {}, f"split these at their seams (or name them in EXCEPTIONS, with why): {over}"


def test_every_exception_is_a_module_still_over_the_limit():
    lines = module_lines()
    stale = [path for path in EXCEPTIONS if lines.get(path, 0) <= MAX_LINES]
    assert stale == [], f"no longer over {MAX_LINES} lines (or gone): drop them from EXCEPTIONS"
