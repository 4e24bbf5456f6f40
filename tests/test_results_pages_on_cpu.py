"""Every page in docs/results is what ``slca-exp compare`` writes today from the study file
committed beside it, so a page cannot drift from the tool that writes it.

Each page's third line names the command that wrote it (``Written by `slca-exp compare
docs/results/<page>_files/study.json.gz ...` on <date>.``). The test runs that command again
into a temporary folder and asks for the same page line for line, but for that line, which
names the temporary folder and today's date.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from slca_exp.commands.compare import main as compare_main

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PAGES = sorted(RESULTS.glob("*.md"))
WRITTEN_BY = re.compile(r"Written by `slca-exp compare ([^`]+)` on \d{4}-\d\d-\d\d \d\d:\d\d UTC\.")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")


def _replaced(argv: list[str], option: str, value: str) -> list[str]:
    at = argv.index(option)
    return [*argv[: at + 1], value, *argv[at + 2 :]]


def test_there_are_results_pages():
    assert PAGES, "docs/results has no page"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_results_page_is_what_compare_writes_from_its_study_file(page, tmp_path, monkeypatch):
    lines = page.read_text().splitlines()
    written_by = WRITTEN_BY.fullmatch(lines[2])
    assert written_by, f"{page.name}: line 3 does not name the compare command: {lines[2]!r}"
    argv = shlex.split(written_by.group(1))
    study = ROOT / argv[0]
    assert argv[0].endswith(".json.gz") and study.is_file(), (
        f"{page.name} was not written from a study file in the repository: {argv[0]}"
    )
    assert (ROOT / argv[argv.index("--report") + 1]).resolve() == page.resolve()
    monkeypatch.chdir(ROOT)  # the command's paths are the repository's
    again = tmp_path / "again.json.gz"
    rerun = _replaced(argv, "--report", str(tmp_path / page.name))
    rerun = _replaced(rerun, "--out", str(tmp_path / "compare"))
    assert compare_main([*rerun, "--save-study", str(again)]) == 0

    regenerated = (tmp_path / page.name).read_text().splitlines()
    assert regenerated[:2] + regenerated[3:] == lines[:2] + lines[3:]
    images = IMAGE.findall(page.read_text())
    assert images, f"{page.name} shows no plot"
    for image in images:
        assert (page.parent / image).is_file(), f"{page.name} shows {image}, which is missing"
        assert (tmp_path / image).is_file(), f"compare no longer draws {image}"
    assert again.read_bytes() == study.read_bytes(), "the study file is not what compare saves"
