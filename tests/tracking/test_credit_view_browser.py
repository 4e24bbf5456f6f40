"""The HTML credit view in a real browser: the page of a logged step (``step_records``) opened
from a file in Debian's Chromium, driven by Playwright, with every non-file request blocked.
The screenshot and the page are kept in ``test-artifacts/browser/`` (or
``$SLCA_EXP_TEST_ARTIFACTS/browser/``)."""

import os
import re
import shutil
from pathlib import Path

import pytest

from slca_exp.tracking.credit_view import render_credit_view, scale_limit
from tests.rollouts.samples import step_records

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(
    os.environ.get("SLCA_EXP_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts")
)
COLOURS = """els => els.map(e => ({
    adv: e.dataset.adv === undefined ? null : Number(e.dataset.adv),
    seg: e.dataset.seg,
    style: e.getAttribute("style"),
    background: getComputedStyle(e).backgroundColor,
}))"""
"""Each matched token's advantage, segment, inline style and computed background colour."""
NEUTRAL = ("rgba(0, 0, 0, 0)", "transparent", "rgb(255, 255, 255)")

pytestmark = pytest.mark.browser

if not CHROMIUM.exists():
    if os.environ.get("CI"):
        raise RuntimeError(
            f"CI is set but {CHROMIUM} is missing: .ci/run installs it (apt chromium)"
        )
    pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium", allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def view(browser, tmp_path_factory):
    """The credit view of ``step_records()`` open offline: (page, records, requests refused)."""
    records = step_records()
    path = tmp_path_factory.mktemp("credit-view") / "credit_view.html"
    path.write_text(render_credit_view(records, title="step 10 · train"), encoding="utf-8")
    kept = ARTIFACTS / "browser" / "credit_view.html"
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, kept)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    refused: list[str] = []

    def offline(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page.route("**/*", offline)
    page.on("request", lambda r: None if r.url.startswith("file:") else refused.append(r.url))
    page.goto(path.as_uri())
    try:
        yield page, records, refused
    finally:
        page.close()


def rgb(colour: str) -> tuple[int, int, int]:
    found = re.fullmatch(r"rgba?\((\d+), (\d+), (\d+)(?:, [\d.]+)?\)", colour)
    assert found, colour
    return int(found.group(1)), int(found.group(2)), int(found.group(3))


def shot(page, name: str) -> Path:
    path = ARTIFACTS / "browser" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def test_the_page_shows_every_rollout_token_by_token(view):
    page, records, _ = view
    assert page.locator("section.rollout").count() == len(records)
    for k, rec in enumerate(records):
        section = page.locator("section.rollout").nth(k)
        assert section.get_attribute("data-group") == rec.group
        assert section.locator(".tok").count() == len(rec.token_ids)
        assert section.locator(".toks").text_content() == rec.response


def test_the_legend_is_visible_and_names_the_scale_s_end_points(view):
    page, records, _ = view
    legend = page.locator("#legend")
    assert legend.is_visible()
    limit = scale_limit(records)
    assert page.locator("#legend .scale-min").inner_text() == f"{-limit:+.3g}" == "-1.1"
    assert page.locator("#legend .scale-max").inner_text() == f"{limit:+.3g}" == "+1.1"
    assert page.locator("#legend .scale-bar").is_visible()
    for key in ("seg-tool", "seg-summary", "seg-env"):
        assert page.locator(f"#legend .key.{key}").is_visible()
    text = legend.inner_text()
    assert "tool segment" in text and "summary segment" in text and "no advantage" in text


def test_tool_and_summary_tokens_are_shaded_by_sign_and_env_tokens_are_not(view):
    page, _, _ = view
    shaded = []
    for seg in ("tool", "summary"):
        tokens = page.eval_on_selector_all(f".rollout .tok.seg-{seg}[data-adv]", COLOURS)
        nonzero = [t for t in tokens if t["adv"] != 0]
        assert nonzero, seg
        for token in nonzero:
            assert token["background"] not in NEUTRAL, token
            r, _, b = rgb(token["background"])
            assert (r > b) == (token["adv"] > 0) and r != b, token  # red positive, blue negative
        zero = [t for t in tokens if t["adv"] == 0]  # the judge-failed rollout's summary
        assert all(t["background"] in NEUTRAL for t in zero), zero
        shaded += nonzero
    # the sample step's tool advantages are +0.8 and -1.1, its summary ones -0.5 and -0.9
    positive = next(t for t in shaded if t["adv"] > 0)
    negative = next(t for t in shaded if t["adv"] < 0)
    assert positive["background"] != negative["background"]
    assert len({t["background"] for t in shaded}) == len({t["adv"] for t in shaded}) == 4
    env = page.eval_on_selector_all(".rollout .tok.seg-env", COLOURS)
    legend_env = page.eval_on_selector_all("#legend .key.seg-env", COLOURS)[0]["background"]
    assert env
    for token in env:
        assert token["adv"] is None and token["style"] is None, token
        assert token["background"] == legend_env, token  # the legend's env grey, no hue
        r, g, b = rgb(token["background"])
        assert r == g == b, token


def test_hovering_a_token_shows_its_id_and_advantage(view):
    page, records, _ = view
    token = page.locator(".rollout .tok.seg-summary[data-adv]").first
    tooltip = "e => getComputedStyle(e, '::after').content"
    assert token.evaluate(tooltip) == "none"
    token.hover()
    title = token.get_attribute("title")
    first = records[0]
    k = first.segments.index("s")
    assert title.startswith(f"id {first.token_ids[k]} · summary · A={first.advantages[k]:+.3f}")
    assert "logp=" in title
    assert token.evaluate(tooltip) == f'"{title}"'  # the CSS tooltip, drawn on hover
    tool = page.locator(".rollout .tok.seg-tool[data-adv]").first
    assert tool.get_attribute("title").startswith(f"id {first.token_ids[0]} · tool · A=+0.800")
    assert shot(page, "credit_view.png").stat().st_size > 10_000


def test_the_page_made_no_network_request(view):
    """Last in this file: every interaction above ran under the same route."""
    page, _, refused = view
    assert page.url.startswith("file:")
    assert refused == []
    assert (
        (ARTIFACTS / "browser" / "credit_view.html")
        .read_text(encoding="utf-8")
        .startswith("<!DOCTYPE html>")
    )
