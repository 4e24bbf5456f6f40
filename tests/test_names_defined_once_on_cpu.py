"""Metric names and MLflow tag keys are spelled once: in ``core/names.py`` and ``core/tags.py``.

Every module of ``slca_exp`` is parsed; a string literal that equals a metric name or a tag key,
or an f-string whose constant text spells one around its placeholders (``f"val/{name}"``), fails
the test with its file, line and the constant or helper to use instead. Docstrings (and the
doctests in them) may show names: they are text for readers, not values the code uses.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from slca_exp.core import names, tags
from tests.syntax import parse

PACKAGE = Path(names.__file__).resolve().parents[1]
HOMES = {Path(names.__file__).resolve(), Path(tags.__file__).resolve()}

NAME_HELPERS = {
    "adv": [(s, t) for s in names.SEGMENTS for t in names.ADV_STATS],
    "present_frac": [(s,) for s in names.SEGMENTS],
    "zeroed_group_frac": [(s,) for s in names.SEGMENTS],
    "tokens_mean": [(s,) for s in names.SEGMENTS],
    "perf_time": [(p,) for p in names.PHASES],
    "tool_component": [(p,) for p in names.TOOL_COMPONENTS],
    "val_success": [(k,) for k in names.SUCCESS_THRESHOLDS],
    "val_tool_success": [(k,) for k in names.SUCCESS_THRESHOLDS],
    "val": [(m,) for m in names.METRICS],
    "eval_metric": [
        ("<benchmark>", "<category>"),
        ("<benchmark>", names.EVAL_OVERALL),
        ("bfcl", "simple_python"),
        ("bfcl", names.EVAL_OVERALL),
    ],
}
TAG_HELPERS = {
    "swept_tag": [("algorithm",), ("reward.tool_weights.parallel",)],
    "job_record": [(0,), (12,)],
    "outage_tag": [("judge",), ("simulator",)],
    "eval_tag": [("bfcl", "version"), ("bfcl", "key")],
    "attempt_tag": [(1,), (12,)],
    "moved_tag": [("0123456789abcdef0123456789abcdef",)],
}
"""Each helper that builds a name, with the arguments it is expanded over."""
NOT_NAMES = {"known", "glossary_markdown", "is_job_record", "short", "is_eval_metric"}
"""Helpers of the two modules that answer questions about names rather than build one."""


def spellings() -> dict[str, str]:
    """Every metric name and tag key -> how code spells it (``names.X``, ``tags.f(...)``)."""
    found: dict[str, str] = {}
    for module, helpers in ((names, NAME_HELPERS), (tags, TAG_HELPERS)):
        short = module.__name__.rsplit(".", 1)[1]
        for attr, value in vars(module).items():
            if attr.isupper() and isinstance(value, str) and _is_key(module, value):
                found.setdefault(value, f"{short}.{attr}")
        for helper, calls in helpers.items():
            for args in calls:
                value = getattr(module, helper)(*args)
                found.setdefault(value, f"{short}.{helper}({', '.join(map(repr, args))})")
    return found


def _is_key(module: object, value: str) -> bool:
    """A metric name has a ``/``; a tag key is dotted (``parent``, a tag's value, is neither)."""
    return "/" in value if module is names else "." in value


def literal_problems(source: str, known: dict[str, str], where: str) -> list[str]:
    """``where:line: literal -> spelling`` for each name spelled in ``source``'s code."""
    tree = parse(source)
    skip = {id(node.value) for node in ast.walk(tree) if _is_doc(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):  # its text is checked as a whole, below
            skip.update(id(part) for part in node.values if isinstance(part, ast.Constant))
        if isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            skip.add(id(node.format_spec))  # ``:.3f``
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.JoinedStr):
            use = sorted({_shape(known[m]) for m in _fstring_matches(node, known)})
            if use:
                text = ast.get_source_segment(source, node)
                found.append((node.lineno, node.col_offset, f"{text} -> {' or '.join(use[:3])}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
            found.append((node.lineno, node.col_offset, f"{node.value!r} -> {known[node.value]}"))
    return [f"{where}:{line}: {what}" for line, _, what in sorted(found)]


def _shape(spelling: str) -> str:
    """``names.val(...)`` for ``names.val('adv/tool/mean')``: an f-string passes its own."""
    return re.sub(r"\(.*\)$", "(...)", spelling)


def _is_doc(node: ast.AST) -> bool:
    """A string statement: a docstring, or an attribute's docstring; never read by code."""
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _fstring_matches(node: ast.JoinedStr, known: dict[str, str]) -> list[str]:
    """The names an f-string can spell with a part of its own: letters and the separator.

    ``f"val/{name}"`` spells ``val/...``; ``f"{rest}s"`` (no ``/``) and ``f"{a}.{b}"`` (no
    letter) spell nothing, though their shapes fit some names.
    """
    parts = [p.value if isinstance(p, ast.Constant) else None for p in node.values]
    text = "".join(p for p in parts if isinstance(p, str))
    if not any(c.isalpha() for c in text):
        return []
    pattern = re.compile("".join(".+" if p is None else re.escape(str(p)) for p in parts))
    return [n for n in known if ("/" if "/" in n else ".") in text and pattern.fullmatch(n)]


def test_every_metric_and_tag_has_one_spelling():
    known = spellings()
    assert set(names.METRICS) | {names.val(m) for m in names.METRICS} <= set(known)
    assert set(tags.TAGS) - set(known) <= {
        key for key in tags.TAGS if "<" in key
    }  # the helpers' keys are listed with a placeholder tail
    for module, helpers in ((names, NAME_HELPERS), (tags, TAG_HELPERS)):
        public = {
            n
            for n, f in vars(module).items()
            if inspect.isfunction(f) and not n.startswith("_") and f.__module__ == module.__name__
        }
        unexpanded = public - set(helpers) - NOT_NAMES
        assert not unexpanded, f"{module.__name__}: expand {unexpanded} in this test's helpers"


def test_no_module_spells_a_metric_name_or_tag_key():
    known = spellings()
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.resolve() in HOMES:
            continue
        where = str(path.relative_to(PACKAGE.parent))
        problems += literal_problems(path.read_text(encoding="utf-8"), known, where)
    assert not problems, "spell these with slca_exp.core.names / slca_exp.core.tags:\n" + "\n".join(
        problems
    )


def test_the_check_finds_planted_names_and_spares_docstrings():
    planted = '''"""Logs judge/requests and tags slca.sweep (a docstring may say so).

>>> stats["reward/tool/mean"]
0.5
"""

def stats(name, value):
    """``reward/total/mean`` of a batch."""
    out = {"reward/tool/mean": value, f"val/{name}": value, "reward/tool": value}
    out[f"{name}/{value}"] = "slca.sweep"
    out[f"slca.swept.{name}"] = out.get("mlflow.parentRunId")
    return f"{name}: {out['val/reward/tool/mean']:.3f}"
'''
    problems = literal_problems(planted, spellings(), "planted.py")
    assert problems == [
        "planted.py:9: 'reward/tool/mean' -> names.REWARD_TOOL_MEAN",
        'planted.py:9: f"val/{name}" -> '
        "names.VAL_SUCCESS or names.val(...) or names.val_success(...)",
        "planted.py:10: 'slca.sweep' -> tags.SWEEP",
        'planted.py:11: f"slca.swept.{name}" -> tags.swept_tag(...)',
        "planted.py:11: 'mlflow.parentRunId' -> tags.PARENT_RUN",
        "planted.py:12: 'val/reward/tool/mean' -> names.val('reward/tool/mean')",
    ]
