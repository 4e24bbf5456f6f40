"""The import structure: the layer contract holds and no import cycle exists, between modules
or between top-level packages, counting every import (inside functions and under
``TYPE_CHECKING`` too: a lazy import that hides a cycle is still a cycle)."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (grimp reads every import statement)."""
    graph = grimp.build_graph(package, cache_dir=None)
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def package_graph(edges: dict[str, set[str]], depth: int = 2) -> dict[str, set[str]]:
    """The graph between packages ``depth`` names deep (``slca_exp.tracking``), self-loops out."""

    def top(module: str) -> str:
        return ".".join(module.split(".")[:depth])

    out: dict[str, set[str]] = {}
    for a, targets in edges.items():
        out.setdefault(top(a), set()).update(top(b) for b in targets if top(b) != top(a))
    return out


def test_the_layer_contract_holds():
    res = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert f"{len(contracts())} kept, 0 broken" in res.stdout


def test_the_independent_commands_are_every_command():
    from slca_exp.commands import COMMANDS

    (contract,) = [c for c in contracts() if c["type"] == "independence"]
    assert contract["modules"] == [f"slca_exp.commands.{name}" for name in COMMANDS]


def test_no_import_cycle_between_modules():
    assert cycles(import_graph("slca_exp")) == []


def test_no_import_cycle_between_top_level_packages():
    assert cycles(package_graph(import_graph("slca_exp"))) == []


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function(tmp_path, monkeypatch):
    pkg = tmp_path / "planted"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "high.py").write_text("from planted.low import core\n")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "core.py").write_text(
        textwrap.dedent(
            """
            def later():
                from planted import high  # the back-edge, inside a function
                return high
            """
        )
    )
    (pkg / "low" / "other.py").write_text("import planted.low.core\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    edges = import_graph("planted")
    assert cycles(edges) == [["planted.high", "planted.low.core"]]
    assert cycles(package_graph(edges)) == [["planted.high", "planted.low"]]


def contracts() -> list[dict]:
    """The import-linter contracts of pyproject.toml."""
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def contract_layers() -> list[str]:
    """The layers of the contract in pyproject.toml, bottom first, as the docs write them."""
    (contract,) = [c for c in contracts() if c["type"] == "layers"]
    return [layer.replace("slca_exp.", "") for layer in reversed(contract["layers"])]


def documented_layers() -> list[str]:
    """The numbered layer list of docs/architecture.md, bottom first, backticks removed."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("<!-- layers:", 1)[1].split("\n\n", 1)[0]
    return [
        re.sub(r"^\d+\. ", "", line).replace("`", "")
        for line in block.splitlines()[1:]
        if re.match(r"^\d+\. ", line)
    ]


def test_the_documented_layers_are_the_contract():
    assert documented_layers() == contract_layers()
    packages = {p.name.removesuffix(".py") for p in (ROOT / "slca_exp").iterdir()}
    listed = {m for layer in contract_layers() for m in re.split(r" [|:] ", layer)}
    # Every package and module of slca_exp is in a layer (besides the package's own files).
    assert packages - {"__init__", "__pycache__", "conf", "py.typed"} == listed
