"""The MLflow UI in a real browser: a real ``mlflow server`` on the store a 2x2 sweep wrote,
driven by Playwright with Debian's Chromium. Screenshots are kept in ``test-artifacts/browser/``
(or ``$SLCA_EXP_TEST_ARTIFACTS/browser/``)."""

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.tracking.sweeps import SLCA_EXE, shared_sweep

CHROMIUM = Path("/usr/bin/chromium")
MLFLOW = Path(sys.executable).parent / "mlflow"
ARTIFACTS = Path(
    os.environ.get("SLCA_EXP_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts")
)
SEGMENT_METRICS = (
    "reward/tool/mean",
    "reward/summary/mean",
    "adv/tool/abs_mean",
    "adv/summary/std",
)
RECIPE_TAGS = ("slca.backbone", "slca.reward", "slca.judge", "slca.simulator", "slca.data")
SWEEP_TAGS = ("slca.sweep", "slca.swept.algorithm", "slca.swept.reward.tool_weights.parallel")

pytestmark = pytest.mark.browser

if not CHROMIUM.exists():
    if os.environ.get("CI"):
        raise RuntimeError(
            f"CI is set but {CHROMIUM} is missing: .ci/run installs it (apt chromium)"
        )
    pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return shared_sweep(tmp_path_factory)


@pytest.fixture(scope="module")
def server(sweep, tmp_path_factory):
    """``mlflow server`` on the sweep's sqlite store, on 127.0.0.1; its base URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("mlflow-server") / "server.log"
    args = [str(MLFLOW), "server", "--backend-store-uri", sweep.uri]
    args += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    with log.open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mlflow server did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield browser.new_page(viewport={"width": 1600, "height": 1000})
        finally:
            browser.close()


def shot(page, name: str) -> Path:
    path = ARTIFACTS / "browser" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def test_runs_page_shows_the_parent_and_its_four_children(sweep, server, page):
    experiment = sweep.parent.info.experiment_id
    page.goto(f"{server}/#/experiments/{experiment}/runs")
    parent_row = page.locator('[role="row"]', has_text=sweep.sweep_id).first
    parent_row.wait_for(timeout=45_000)
    for child in sweep.children:  # folded under the parent until it is expanded
        assert not page.get_by_text(child.info.run_name, exact=True).first.is_visible()
    parent_row.locator('button[data-component-id*="runnamecellrenderer"]').first.click()
    for child in sweep.children:
        page.get_by_text(child.info.run_name, exact=True).first.wait_for(timeout=15_000)
    assert page.get_by_text("5 matching runs").first.is_visible()
    assert shot(page, "runs.png").stat().st_size > 10_000


def test_compare_page_shows_runs_slca_tags_and_segment_metrics(sweep, server, page, tmp_path):
    res = subprocess.run(
        [SLCA_EXE, "compare", sweep.sweep_id, "--tracking-uri", sweep.uri, "--ui-url", server],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr
    url = re.search(r"MLflow compare page: (\S+)", res.stdout).group(1)
    page.goto(url)
    page.get_by_text("Comparing 4 Runs from 1 Experiment").wait_for(timeout=45_000)
    for child in sweep.children:
        page.get_by_text(child.info.run_id, exact=True).first.wait_for(timeout=10_000)
    text = page.inner_text("body")
    for name in (*RECIPE_TAGS, *SWEEP_TAGS, *SEGMENT_METRICS):
        assert name in text, f"{name} not shown on {url}"
    assert sweep.sweep_id in text
    assert shot(page, "compare.png").stat().st_size > 10_000
    page.get_by_text("slca.judge", exact=True).first.scroll_into_view_if_needed()
    shot(page, "compare-tags.png")
