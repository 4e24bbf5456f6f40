"""The README and docs/ stay true to the code they describe.

    slca_exp/conf/<group>/<option>.yaml  ==  docs/configuration.md's config-group table
    slca_exp.core.names.METRICS          ==  docs/metrics.md's glossary
    README.md: at most 200 lines, `make demo` and `make test` first, a link to every docs/ file
    README.md and docs/*.md: every relative link and #anchor resolves inside the repository,
        every repository path written as code exists, every `group=option` in the README exists
    README.md, docs/ and the package: no absolute path of one machine; with tests/: no tracker
        item cited

Each check reads files only (no Hydra, no subprocess), so the whole file takes well under a
second.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import OmegaConf

from slca_exp.core import names
from slca_exp.evaluation.benchmark import DEFAULT as DEFAULT_BENCHMARK
from slca_exp.evaluation.settings import DEFAULT as DEFAULT_EVAL
from slca_exp.launch.profiles import DEFAULT as DEFAULT_LAUNCHER

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONF = ROOT / "slca_exp" / "conf"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
MAX_README_LINES = 200

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", flags=re.M | re.S)
PATH_ROOTS = ("slca_exp/", "tests/", "benchmarks/", "docs/", ".ci/")
"""A code span starting with one of these names a file or folder of the repository."""
PLACEHOLDER = re.compile(r"[<>*{}\[\]]|\.\.\.")
"""A path with a placeholder (``runs/<key>/``, ``offline-run-*``) names a pattern, not a file."""


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (commands and output, not links)."""
    return FENCE.sub("", text)


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of every body row of the first table under ``heading`` (to the next heading)."""
    section = text.split(f"\n{heading}\n", 1)[1]
    section = re.split(r"^#{1,6} ", section, maxsplit=1, flags=re.M)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def at(page: Path, target: str) -> Path:
    """Where a relative link of ``page`` points, as written (``..`` folded, links not followed)."""
    return Path(os.path.normpath(page.parent / target))


def names_a_path(span: str) -> bool:
    """Whether a code span is a repository path (not a command, not a pattern)."""
    return span.startswith(PATH_ROOTS) and " " not in span and not PLACEHOLDER.search(span)


def anchors(page: Path) -> set[str]:
    """Every ``#anchor`` a page's headings define (a repeated heading gets ``-1``, ``-2``, ...)."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose(page.read_text()), flags=re.M):
        base, n = slug(heading), 0
        while (candidate := base if n == 0 else f"{base}-{n}") in found:
            n += 1
        found.add(candidate)
    return found


# --- (a) the config-group table ----------------------------------------------------------------


def conf_groups() -> dict[str, set[str]]:
    """Every config group under slca_exp/conf (launchers and sweeps included) -> its options."""
    return {
        folder.name: {option.stem for option in folder.glob("*.yaml")}
        for folder in sorted(CONF.iterdir())
        if folder.is_dir() and any(folder.glob("*.yaml"))
    }


def conf_defaults() -> dict[str, str]:
    """The option each group starts from: config.yaml's defaults list, and the CLI's groups'.

    A group listed with ``null`` (``ablation``) starts from none.
    """
    defaults = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"))["defaults"]
    chosen = {
        k: v
        for entry in defaults
        if isinstance(entry, dict)
        for k, v in entry.items()
        if v is not None
    }
    # the CLI's own groups start from the CLI's defaults
    return {
        **chosen,
        "launcher": DEFAULT_LAUNCHER,
        "benchmark": DEFAULT_BENCHMARK,
        "eval": DEFAULT_EVAL,
    }


def documented_groups() -> dict[str, tuple[set[str], list[str]]]:
    """The table of docs/configuration.md: group -> (its options, those marked ``(default)``)."""
    table = table_rows((DOCS / "configuration.md").read_text(), "## Config groups")
    out = {}
    for group, options, *_ in table:
        listed = set(re.findall(r"`([^`]+)`", options))
        marked = re.findall(r"`([^`]+)` \(default\)", options)
        out[group.strip("`")] = (listed, marked)
    return out


def test_the_config_group_table_lists_every_group_and_option_of_conf():
    groups, table = conf_groups(), documented_groups()
    assert {"launcher", "sweep", "engine", "experiment"} <= set(groups)
    missing = sorted(set(groups) - set(table))
    gone = sorted(set(table) - set(groups))
    assert not missing, f"docs/configuration.md has no row for the config groups {missing}"
    assert not gone, f"docs/configuration.md lists config groups that conf/ lacks: {gone}"
    for group, options in groups.items():
        listed, _ = table[group]
        assert listed == options, (
            f"docs/configuration.md, group {group}: not listed {sorted(options - listed)}, "
            f"listed but not in slca_exp/conf/{group}/: {sorted(listed - options)}"
        )


def test_the_config_group_table_marks_each_groups_default():
    defaults, table = conf_defaults(), documented_groups()
    for group, (_, marked) in table.items():
        expected = [defaults[group]] if group in defaults else []
        assert marked == expected, f"docs/configuration.md, group {group}: default {expected}"


# --- (b) the metric glossary -------------------------------------------------------------------


def test_the_metric_glossary_is_the_names_modules_own_table():
    text = (DOCS / "metrics.md").read_text()
    rows = table_rows(text, "## Metric glossary")
    listed = [name.strip("`") for name, *_ in rows]
    assert len(listed) == len(set(listed)), "docs/metrics.md lists a metric twice"
    assert set(listed) == set(names.METRICS), (
        f"not in docs/metrics.md: {sorted(set(names.METRICS) - set(listed))}; "
        f"not defined in slca_exp/core/names.py: {sorted(set(listed) - set(names.METRICS))}"
    )
    assert names.glossary_markdown() in text, (
        "docs/metrics.md's glossary differs from `python -m slca_exp.core.names`: paste that in"
    )


# --- (c) the README and the links -------------------------------------------------------------


def test_the_readme_is_short_and_starts_with_the_two_commands():
    text = README.read_text()
    lines = len(text.splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES})"
    first_block = FENCE.search(text).group(0).splitlines()[1:-1]
    shown = [line.split()[:2] for line in first_block]
    assert shown == [["make", "demo"], ["make", "test"]], f"README.md's first commands: {shown}"


def test_the_readme_links_every_file_in_docs():
    linked = {
        at(README, target.split("#")[0]) for target in LINK.findall(prose(README.read_text()))
    }
    files = {p for p in DOCS.rglob("*.md")}
    unlinked = sorted(str(p.relative_to(ROOT)) for p in files - linked)
    assert len(files) >= 10
    assert not unlinked, f"README.md's map of docs/ misses {unlinked}"


def test_every_image_in_docs_is_shown_by_a_page():
    shown = {
        at(page, target.split("#")[0])
        for page in PAGES
        for target in LINK.findall(prose(page.read_text()))
    }
    images = {p for p in DOCS.rglob("*") if p.is_file() and p.suffix != ".md"}
    assert not sorted(str(p.relative_to(ROOT)) for p in images - shown)


def test_every_relative_link_resolves_inside_the_repository():
    broken = []
    for page in PAGES:
        for target in LINK.findall(prose(page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = at(page, path) if path else page
            where = f"{page.relative_to(ROOT)}: {target}"
            if path.startswith("/") or not resolved.is_relative_to(ROOT):
                broken.append(f"{where} (outside the repository)")
            elif not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_repository_path_written_as_code_exists():
    missing = []
    for page in PAGES:
        for span in CODE.findall(prose(page.read_text())):
            if names_a_path(span) and not (ROOT / span).exists():
                missing.append(f"{page.relative_to(ROOT)}: `{span}`")
    assert not missing, "\n".join(missing)


def test_every_group_option_in_the_readme_exists():
    groups = conf_groups()
    unknown = []
    for group, values in re.findall(r"(?<![\w./+~-])([a-z_]+)=([\w.,-]+)", README.read_text()):
        if group in groups:
            unknown += [f"{group}={v}" for v in values.split(",") if v not in groups[group]]
    assert not unknown, f"README.md picks options conf/ does not have: {unknown}"


# --- (d) nothing of one machine or of the tracker ----------------------------------------------

MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|home/[a-z]+)/")
"""An absolute path of one machine: a reader's sample output names their own folders instead."""
TRACKER_ITEM = re.compile(r"\b[Ii]ssues? #?[0-9]+")
"""A reference to a tracker item, which says nothing to a reader of the repository."""


def shipped_files(*folders: str) -> list[Path]:
    """The package's sources, configs and prompts (or the tests'), without caches."""
    return [
        p
        for folder in folders
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".py", ".yaml", ".txt") and "__pycache__" not in p.parts
    ]


def test_no_page_or_package_file_names_a_machine_path():
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in [*PAGES, *shipped_files("slca_exp")]
        for n, line in enumerate(p.read_text().splitlines(), start=1)
        if MACHINE_PATH.search(line)
    ]
    assert not found, "name paths relative to where the command runs:\n" + "\n".join(found)


def test_no_page_package_or_test_file_cites_a_tracker_item():
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in [*PAGES, *shipped_files("slca_exp", "tests")]
        for n, line in enumerate(p.read_text().splitlines(), start=1)
        if TRACKER_ITEM.search(line)
    ]
    assert not found, "say what is checked instead:\n" + "\n".join(found)
