"""The MLflow UI in a real browser: ``slca-exp ui`` (a real ``mlflow server``) on the store a 2x2
sweep wrote (one job re-run on a split of another data seed, plus a GenAI experiment and an
untagged one), driven by Playwright with Debian's Chromium.
Screenshots are kept in ``test-artifacts/browser/`` (or ``$SLCA_EXP_TEST_ARTIFACTS/browser/``)."""

import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient
from playwright.sync_api import expect

from slca_exp.core.tags import EXPERIMENT_KIND
from slca_exp.tracking import lineage
from slca_exp.tracking.rollout_log import RolloutLog
from slca_exp.tracking.rollout_traces import TraceSources
from tests.rollouts.checks import traces_of
from tests.rollouts.samples import step_records
from tests.tracking.sweeps import SLCA_EXE, run_train, shared_sweep

CHROMIUM = Path("/usr/bin/chromium")
SOURCES = TraceSources("replay", "hierr/strict", "rubric@rubric-v2", "slca_grpo")
TOOL_REWARDS = (0.35, 0.9, 0.6, 0.15, 0.75, 0.5, 0.25)
"""The logged rollouts' tool rewards (train best/worst x 2, then 3 validation rollouts)."""
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
TRAINING = "workflowType=machine_learning"
"""MLflow 3.17's UI shows the model-training view for this query (its GenAI / Model training
switch); without it the browser's last choice, GenAI at first, unless ``slca-exp ui`` routes
the experiment by its kind tag."""
GENAI = "workflowType=genai"
ROUTING_S = 3.0
"""Time the page's routing script is given to act (one REST call on 127.0.0.1)."""
VIEW_KEY = "mlflow.workflowType_v1"
"""Where MLflow's UI keeps the browser's last view choice (localStorage)."""
SWEEP_TAGS = ("slca.sweep", "slca.swept.algorithm", "slca.swept.reward.tool_weights.parallel")
DOCS_VIEWPORT = {"width": 1280, "height": 800}
"""The rollout pages' viewport: their screenshots are the ones ``docs/images/`` shows."""
NO_ASSISTANT = """if (location.protocol === "http:") {  // not in the credit view's blob: frame
    localStorage.setItem("mlflow.assistant.fab.autoOpenedOnFirstLoad_v1", "true");
    localStorage.setItem("mlflow.assistant.panelOpen_v1", "false");
}"""
"""MLflow 3.17 opens its assistant panel on a browser's first visit, over a third of the page."""
WAIT_MS = 45_000
COLOURS = """els => els.map(e => ({
    adv: e.dataset.adv === undefined ? null : Number(e.dataset.adv),
    style: e.getAttribute("style"),
    background: getComputedStyle(e).backgroundColor,
}))"""
"""Each matched token's advantage, inline style and computed background colour."""
NEUTRAL = ("rgba(0, 0, 0, 0)", "transparent", "rgb(255, 255, 255)")

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


@dataclass
class Store:
    """A copy of the sweep's store in which job 3 was re-run with ``data.seed=7``."""

    uri: str
    sweep_id: str
    parent: object
    children: list
    """The four active children (the re-run job instead of the original one)."""
    reseeded: str
    """The re-run job's run id."""
    genai: str
    """An experiment a user tagged as a GenAI one."""
    untagged: str
    """An experiment without a kind tag."""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    shared = shared_sweep(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("reseeded")
    shutil.copy(shared.root / "mlflow.db", tmp / "mlflow.db")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = MlflowClient(uri)
    replaced = next(c for c in shared.children if c.data.tags["slca.job"] == "3")
    parent = shared.parent.info.run_id
    env = {"SLCA_EXP_PARENT_RUN_ID": parent, "SLCA_EXP_SWEEP_ID": shared.sweep_id}
    job = [*replaced.data.tags["slca.overrides"].split(), "data.seed=7", "run_name=job3-seed7"]
    assert run_train([*job, f"tracking.mlflow_uri={uri}"], tmp / "root", tmp, env) == 0
    client.delete_run(replaced.info.run_id)
    found = client.search_runs(
        [shared.parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'"
    )
    children = [client.get_run(r.info.run_id) for r in found]  # with their dataset inputs
    reseeded = next(c.info.run_id for c in children if c.info.run_name == "job3-seed7")
    genai = client.create_experiment("chat-app", tags={EXPERIMENT_KIND: "genai_development"})
    untagged = client.create_experiment("notebook-runs")
    return Store(uri, shared.sweep_id, shared.parent, children, reseeded, genai, untagged)


@pytest.fixture(scope="module")
def ui(sweep, tmp_path_factory):
    """``slca-exp ui`` on the sweep's sqlite store, on 127.0.0.1: (base URL, its process)."""
    port = free_port()
    log = tmp_path_factory.mktemp("mlflow-server") / "server.log"
    args = [SLCA_EXE, "ui", "--tracking-uri", sweep.uri, "--port", str(port)]
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
        experiment = sweep.parent.info.experiment_id
        assert f"slca-exp ui: MLflow UI on {sweep.uri} at {url}" in log.read_text()
        assert f"{url}/#/experiments/{experiment}\n" in log.read_text()  # each experiment's page
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def server(ui):
    """The base URL of the UI."""
    return ui[0]


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
def page(browser):
    return browser.new_page(viewport={"width": 1600, "height": 1000})


@dataclass
class Rollouts:
    """Step 10 of one run's logged rollouts (train and val), written through the server."""

    run_id: str
    experiment_id: str
    records: list
    traces: dict[str, str]
    """Trace name (``<split> step <N> <group>#<sample>``) -> trace id."""


@pytest.fixture(scope="module")
def rollouts(sweep, server):
    """The re-run job's step 10 logged by ``RolloutLog`` on the server's URI, as a run does."""
    run = next(c for c in sweep.children if c.info.run_id == sweep.reseeded)
    run_id, experiment = run.info.run_id, run.info.experiment_id
    records = [*step_records(step=10), *step_records(step=10, split="val")]
    for record, tool in zip(records, TOOL_REWARDS, strict=True):  # distinct: a sort shows
        record.rewards = dataclasses.replace(record.rewards, tool=tool)
    log = RolloutLog(server, run_id, experiment, sources=SOURCES)
    start = time.monotonic()
    try:
        log.log(records[:4], 10, "train")
        log.log(records[4:], 10, "val")
        log.flush()
    finally:
        mlflow.set_tracking_uri(None)  # RolloutLog sets this process's URI
    print(f"rollouts logged through the server in {time.monotonic() - start:.1f}s")
    assert log.warned == set()
    traces = {}
    for trace in traces_of(MlflowClient(server), run_id):
        root = next(s for s in trace.data.spans if s.parent_id is None)
        traces[root.name] = trace.info.trace_id
    names = {f"{r.split} step {r.step} {r.group}#{r.sample}" for r in records}
    assert set(traces) == names and len(names) == len(records) == 7
    artifacts = {f.path for f in MlflowClient(server).list_artifacts(run_id, "rollouts/train")}
    assert "rollouts/train/step_000010.html" in artifacts
    return Rollouts(run_id, experiment, records, traces)


@pytest.fixture
def tab(browser, server):
    """A page of its own (the docs' viewport, no assistant panel), every request kept:
    (page, requests to anything but the server, all of which are refused)."""
    context = browser.new_context(viewport=DOCS_VIEWPORT)
    context.add_init_script(NO_ASSISTANT)
    refused: list[str] = []

    def local_only(route):
        if route.request.url.startswith(f"{server}/"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    context.route("**/*", local_only)
    try:
        yield context.new_page(), refused
    finally:
        context.close()


def rgb(colour: str) -> tuple[int, int, int]:
    found = re.fullmatch(r"rgba?\((\d+), (\d+), (\d+)(?:, [\d.]+)?\)", colour)
    assert found, colour
    return int(found.group(1)), int(found.group(2)), int(found.group(3))


def filter_span_type(page, kind: str) -> None:
    """Toggle one span type in the trace's span tree (its settings menu, Filter by span type)."""
    page.locator('[data-component-id="shared.model-trace-explorer.settings-button"]').click()
    page.get_by_role("menuitem", name="Filter by span type").hover()
    page.get_by_role("menuitemcheckbox", name=kind, exact=True).click()
    page.keyboard.press("Escape")  # closes the menu and its submenu, not the trace
    expect(page.get_by_role("menu")).to_have_count(0)


def hash_of(page) -> str:
    """The page's location hash (``page.url`` lags behind the UI's own history changes)."""
    return page.evaluate("location.hash")


def wait_for_hash(page, pattern: str, timeout_ms: int = 45_000) -> None:
    """Wait until the page's location hash matches ``pattern`` (a JavaScript regex).

    The UI moves between its views with the history API and hash changes, which do not all
    reach Playwright as navigations; the hash itself is polled instead.
    """
    page.wait_for_function(
        "pattern => new RegExp(pattern).test(location.hash)", arg=pattern, timeout=timeout_ms
    )


def open_anew(page, url: str) -> None:
    """Load ``url`` as a new document: the UI starts afresh, as in a new tab.

    A ``goto`` that changes only the hash stays in the running UI, which may still be moving
    to the last view's URL; a reload then would reload that one.
    """
    page.goto("about:blank")
    page.goto(url)


def shot(page, name: str, *, full_page: bool = True) -> Path:
    path = ARTIFACTS / "browser" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=full_page)
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
    assert "warning: runs differ in data" in res.stderr  # the re-run job's split
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


def test_the_training_view_shows_each_run_s_datasets_prompts_and_model(sweep, server, page):
    experiment = sweep.parent.info.experiment_id
    # A plain link opens the experiment (tagged for training) in the model-training view, whose
    # landing page is its runs table.
    page.goto(f"{server}/#/experiments/{experiment}")
    page.wait_for_url(
        re.compile(rf".*/experiments/{experiment}/runs\?.*{TRAINING}"), timeout=45_000
    )
    page.get_by_text("Model registry").first.wait_for(timeout=15_000)  # the training sidebar
    parent_row = page.locator('[role="row"]', has_text=sweep.sweep_id).first
    parent_row.wait_for(timeout=45_000)
    digests = {c.info.run_id: lineage.run_datasets(c) for c in sweep.children}
    first_child = page.locator(f'[role="row"][row-id="{sweep.children[0].info.run_id}"]').first
    if not first_child.is_visible():  # the UI remembers a sweep unfolded by an earlier visit
        parent_row.locator('button[data-component-id*="runnamecellrenderer"]').first.click()
    for run_id, splits in digests.items():
        assert sorted(splits) == ["synthetic-sft", "synthetic-train", "synthetic-val"]
        cells = page.locator(f'[role="row"][row-id="{run_id}"]')
        cells.first.wait_for(timeout=15_000)
        text = " ".join(cells.nth(i).inner_text() for i in range(cells.count()))
        for name, digest in splits.items():  # the Dataset column: name (digest) per split
            assert f"{name} ({digest})" in text, text
        assert "policy" in text  # the Models column: its logged model
    # The three original jobs share their digests; the re-seeded job's differ in every split.
    others = [d for run_id, d in digests.items() if run_id != sweep.reseeded]
    assert len(others) == 3 and all(d == others[0] for d in others)
    assert all(digests[sweep.reseeded][s] != others[0][s] for s in others[0])
    shot(page, "runs-datasets.png")
    # The Datasets filter offers each split under both digests.
    page.get_by_text("Datasets", exact=True).first.click()
    options = page.get_by_role("option")
    options.first.wait_for(timeout=15_000)
    labels = [options.nth(i).inner_text() for i in range(options.count())]
    assert {label.split()[0] for label in labels} == set(others[0])
    for digest in {others[0]["synthetic-train"], digests[sweep.reseeded]["synthetic-train"]}:
        assert any(label.startswith(f"synthetic-train ({digest})") for label in labels), labels
    shot(page, "runs-dataset-filter.png")
    page.keyboard.press("Escape")

    # The run page: its datasets, its registered prompts, its logged model.
    child = next(c for c in sweep.children if c.info.run_id == sweep.reseeded)
    page.goto(f"{server}/#/experiments/{experiment}/runs/{child.info.run_id}?{TRAINING}")
    page.get_by_text("Logged models (1)").first.wait_for(timeout=45_000)
    text = page.inner_text("body")
    for prompt in lineage.linked_prompts(child):
        assert f"{prompt['name']} (v{prompt['version']})" in text
    assert {p["name"] for p in lineage.linked_prompts(child)} == {
        "slca-exp.judge.rubric",
        "slca-exp.simulator.replay",
    }
    assert "Registered prompts" in text and "Datasets" in text
    assert "policy" in text and "Ready" in text
    page.get_by_text("+2", exact=True).first.click()  # the Datasets section lists the other two
    page.get_by_text("synthetic-val (").first.wait_for(timeout=15_000)
    text = page.inner_text("body")
    for name, digest in digests[sweep.reseeded].items():
        assert f"{name} ({digest})" in text
    shot(page, "run.png")
    page.keyboard.press("Escape")
    page.get_by_text("Logged models (1)").first.scroll_into_view_if_needed()
    shot(page, "run-logged-model.png")


def test_each_experiment_opens_in_the_view_its_kind_tag_names(sweep, server, browser):
    context = browser.new_context(viewport={"width": 1600, "height": 1000})  # no last choice
    page = context.new_page()
    training = sweep.parent.info.experiment_id
    try:
        # From the experiments list, in a browser whose view is GenAI (MLflow's default).
        page.goto(f"{server}/#/experiments")
        page.locator(f'a[href="#/experiments/{training}"]').first.click()  # its name, listed
        wait_for_hash(page, rf"^#/experiments/{training}/runs\?.*{TRAINING}")
        page.get_by_text("Model registry").first.wait_for(timeout=15_000)
        shot(page, "view-training.png")

        # An experiment without a kind keeps the browser's choice (GenAI here), unrouted.
        open_anew(page, f"{server}/#/experiments/{sweep.untagged}")
        wait_for_hash(page, rf"^#/experiments/{sweep.untagged}/.*{GENAI}")
        time.sleep(ROUTING_S)
        assert TRAINING not in hash_of(page) and "Model registry" not in page.inner_text("body")

        # An explicit choice (a link, the switch) is left alone.
        open_anew(page, f"{server}/#/experiments/{training}?{GENAI}")
        time.sleep(ROUTING_S)
        assert GENAI in hash_of(page) and TRAINING not in hash_of(page), hash_of(page)

        # The browser last chose Model training; a GenAI experiment still opens as GenAI.
        page.evaluate(f"localStorage.setItem({VIEW_KEY!r}, JSON.stringify('machine_learning'))")
        open_anew(page, f"{server}/#/experiments/{sweep.genai}")
        wait_for_hash(page, rf"^#/experiments/{sweep.genai}.*{GENAI}")
        time.sleep(ROUTING_S)
        assert GENAI in hash_of(page) and "Model registry" not in page.inner_text("body")
        shot(page, "view-genai.png")
    finally:
        context.close()


def test_the_runs_traces_tab_lists_its_rollouts_and_shows_a_tool_span(server, rollouts, tab):
    page, refused = tab
    start = time.monotonic()
    base = f"{server}/#/experiments/{rollouts.experiment_id}/runs/{rollouts.run_id}"
    page.goto(f"{base}?{TRAINING}")
    traces_tab = page.get_by_role("tab", name="Traces", exact=True)
    traces_tab.click(timeout=WAIT_MS)
    # The tab's own route (``.../traces`` shows the same table, with no tab selected).
    wait_for_hash(
        page, rf"^#/experiments/{rollouts.experiment_id}/runs/{rollouts.run_id}/evaluations"
    )
    expect(traces_tab).to_have_attribute("aria-selected", "true")
    table = page.locator('[role="row"]')
    for trace_id in rollouts.traces.values():  # every logged rollout, by its id
        expect(page.get_by_title(trace_id, exact=True)).to_be_visible(timeout=WAIT_MS)
    # Trace names are a column the table hides at first: shown from its Columns menu.
    page.get_by_role("button", name=re.compile(r"^Columns")).click()  # "Columns 5/24"
    page.get_by_role("option", name="Trace name", exact=True).click()
    page.get_by_role("option", name="Request", exact=True).click()  # one prompt, every row
    page.keyboard.press("Escape")
    for name in rollouts.traces:
        expect(table.filter(has_text=name)).to_have_count(1, timeout=15_000)
    listed = time.monotonic() - start
    assert shot(page, "run_traces.png", full_page=False).stat().st_size > 10_000

    name = "train step 10 train-3#2"
    page.get_by_text(name, exact=True).click()
    wait_for_hash(page, rf"selectedEvaluationId={rollouts.traces[name]}")
    trace = page.get_by_role("dialog")
    nodes = page.locator('[data-testid^="timeline-tree-node-"]')  # the trace's span tree
    tool = nodes.filter(has_text="get_weather")
    expect(tool).to_have_count(1, timeout=WAIT_MS)
    expect(nodes).to_have_count(4)  # AGENT, CHAT_MODEL, TOOL, CHAT_MODEL
    # Its type: the span tree's type filter drops it with the Tool type, and only it.
    filter_span_type(page, "Tool")
    expect(tool).to_have_count(0)
    expect(nodes).to_have_count(3)
    filter_span_type(page, "Tool")
    expect(tool).to_have_count(1)
    tool.click()
    # Its inputs (the call) and outputs (the simulator's answer), in the span's own pane.
    pane = trace.get_by_role("tabpanel", name="Inputs / Outputs")
    expect(pane.get_by_text("get_weather", exact=True)).to_be_visible(timeout=15_000)
    for shown in ("city: Paris", '{"temp": 21}', "replay", "ok"):
        expect(pane.get_by_text(shown, exact=True)).to_be_visible()
    print(f"traces listed in {listed:.1f}s, TOOL span shown in {time.monotonic() - start:.1f}s")
    assert shot(page, "trace_tool_span.png", full_page=False).stat().st_size > 10_000
    assert refused == []


def column(page, name: str) -> list[str]:
    """The texts of the traces table's column ``name``, row by row, as shown."""
    rows = page.locator('[role="row"]')
    header = rows.filter(has=page.get_by_role("columnheader", name="Trace ID"))
    names = [h.split("\n")[0] for h in header.get_by_role("columnheader").all_inner_texts()]
    index = names.index(name)
    return [row.get_by_role("cell").nth(index).inner_text() for row in rows.all()[2:]]


def test_the_traces_tab_shows_rewards_as_assessments_sorts_by_them_and_marks_a_failed_judge(
    server, rollouts, tab
):
    page, refused = tab
    base = f"{server}/#/experiments/{rollouts.experiment_id}/runs/{rollouts.run_id}"
    page.goto(f"{base}?{TRAINING}")
    page.get_by_role("tab", name="Traces", exact=True).click(timeout=WAIT_MS)
    headers = page.locator('[role="columnheader"]')
    # The first five assessment names are columns from the start: the tool reward among them.
    for name in ("reward_tool", "judge_rating", "judge_status", "advantage_tool"):
        expect(headers.filter(has_text=re.compile(f"^{name}"))).to_have_count(1, timeout=WAIT_MS)
    expect(page.locator('[role="row"]')).to_have_count(2 + len(rollouts.records))
    page.get_by_role("button", name="Sort", exact=True).click()
    page.get_by_text("reward_tool", exact=True).last.click()
    page.get_by_role("button", name=re.compile("^Sort: reward_tool")).click()
    page.get_by_role("button", name="Sort descending", exact=True).click()
    page.keyboard.press("Escape")
    want = [f"{t:g}" for t in sorted(TOOL_REWARDS, reverse=True)]
    deadline = time.monotonic() + 30
    while column(page, "reward_tool") != want and time.monotonic() < deadline:
        time.sleep(0.5)
    assert column(page, "reward_tool") == want
    # The failed judgment: a failed assessment (Error), not a score; its status says failed.
    failed = [r for r in rollouts.records if r.rewards.judge_status == "failed"]
    assert len(failed) == 1
    ratings, statuses = column(page, "judge_rating"), column(page, "judge_status")
    at = want.index(f"{failed[0].rewards.tool:g}")
    assert (ratings[at], statuses[at]) == ("Error", "failed")
    assert [r for i, r in enumerate(ratings) if i != at] == [
        str(r.rewards.rating)
        for r in sorted(rollouts.records, key=lambda r: -r.rewards.tool)
        if r.rewards.judge_status == "ok"
    ]
    page.set_viewport_size({"width": 1700, "height": 800})  # every assessment column in view
    assert shot(page, "run_traces_assessments.png", full_page=False).stat().st_size > 10_000
    assert refused == []


def test_a_logged_credit_view_opens_from_the_run_with_its_legend_and_shaded_segments(
    server, rollouts, tab
):
    page, refused = tab
    start = time.monotonic()
    base = f"{server}/#/experiments/{rollouts.experiment_id}/runs/{rollouts.run_id}"
    page.goto(f"{base}/artifacts?{TRAINING}")
    for folder in ("rollouts", "train"):  # the artifact tree's folders, unfolded
        entry = page.get_by_text(folder, exact=True).first
        entry.wait_for(timeout=WAIT_MS)
        entry.click()
    path = "rollouts/train/step_000010.html"
    artifact = f"/get-artifact?path={urllib.parse.quote(path, safe='')}&run_uuid={rollouts.run_id}"
    with page.expect_response(f"{server}{artifact}", timeout=WAIT_MS) as fetched:
        page.get_by_text("step_000010.html", exact=True).click()
    assert fetched.value.ok and fetched.value.headers["content-type"].startswith("text/html")
    # The UI shows an HTML artifact in a sandboxed frame of its own (a blob: URL).
    frame_element = page.locator("iframe").first
    frame_element.wait_for(timeout=WAIT_MS)
    view = frame_element.element_handle().content_frame()
    view.wait_for_selector("#legend", timeout=WAIT_MS)
    assert view.url.startswith("blob:") and view.title() == (
        "train step 10: rollouts and their token advantages"
    )
    assert view.locator("section.rollout").count() == 4

    legend = view.locator("#legend")
    expect(legend).to_be_visible()
    expect(legend.locator(".scale-min")).to_have_text("-1.1")
    expect(legend.locator(".scale-max")).to_have_text("+1.1")
    expect(legend.locator(".scale-bar")).to_be_visible()
    for key in ("tool segment", "summary segment", "no advantage"):
        expect(legend).to_contain_text(key)
    shaded = []
    for seg in ("tool", "summary"):
        tokens = view.eval_on_selector_all(f".rollout .tok.seg-{seg}[data-adv]", COLOURS)
        nonzero = [t for t in tokens if t["adv"] != 0]
        assert nonzero, seg
        for token in nonzero:
            assert "background:#" in token["style"], token
            assert token["background"] not in NEUTRAL, token
            r, _, b = rgb(token["background"])
            assert (r > b) == (token["adv"] > 0) and r != b, token  # red positive, blue negative
        shaded += nonzero
    positive = {t["background"] for t in shaded if t["adv"] > 0}
    negative = {t["background"] for t in shaded if t["adv"] < 0}
    assert positive and negative and not positive & negative
    env = view.eval_on_selector_all(".rollout .tok.seg-env", COLOURS)
    assert env
    for token in env:
        assert token["adv"] is None and token["style"] is None, token
        r, g, b = rgb(token["background"])
        assert r == g == b, token  # grey, no hue
    print(f"credit view opened from the run's artifacts in {time.monotonic() - start:.1f}s")
    assert shot(page, "credit_view_from_mlflow.png", full_page=False).stat().st_size > 10_000
    assert refused == []


def test_the_ui_page_carries_the_routing_script_and_sigterm_stops_the_server(ui):
    """Last in this file: it stops the module's server."""
    url, proc = ui
    page = urllib.request.urlopen(f"{url}/", timeout=10).read().decode()
    assert page.startswith('<!doctype html><html lang="en"><head><script>')
    assert '"custom_model_development": "machine_learning"' in page
    assert "main." in page  # MLflow's own bundle is still loaded
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as probe:  # the server went with it: nothing listens any more
        assert probe.connect_ex(("127.0.0.1", port)) != 0
