"""Argument agreement between a gold call and a predicted call, and matching calls one to one.

``paper`` matching follows the public HierR reward: for each gold call in order, the unused
prediction with the same name that scores the highest key + value above 0 (defect (f): the result
depends on the order of the gold calls). ``strict`` matching is an optimal one-to-one assignment
maximising the total key + value (exhaustive for small sets,
``scipy.optimize.linear_sum_assignment`` beyond).

Two value equalities: :func:`public_equal` is the public reward's (its text form first, so a list
equals its Python repr and NaN equals NaN); :func:`loose_equal`, which the strict reward uses,
compares by type (a string equals a boolean only when it spells one; lists and dicts only equal
lists and dicts).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from functools import partial
from itertools import permutations
from typing import Any

from slca_exp.rewards.types import ToolCall

NUMBER_TOL = 1e-9
_BFCL_DROP = re.compile(r"[ ,./\-_*^]")
_NUMERIC_START = frozenset("0123456789+-.")
_TRUE = frozenset({"true", "1"})
_FALSE = frozenset({"false", "0"})
_BOOL_TEXT = {"true": True, "1": True, "false": False, "0": False}
Equal = Callable[[Any, Any], bool]
"""A value equality: ``equal(gold, pred)``."""
EXACT_LIMIT = 6
"""Largest side for which strict matching searches every assignment instead of calling scipy."""


def loose_equal(gold: Any, pred: Any, *, normalize_strings: bool = False) -> bool:  # noqa: ANN401
    """Whether two argument values agree, the strict reward's way: loosely, but by type.

    Both ``None``; a boolean against a boolean, ``1``/``0`` or a string spelling one
    (true/false/1/0); numbers (or numeric strings) within 1e-9, NaN equal to nothing; strings
    trimmed and lower-cased (``normalize_strings``: also BFCL-style, dropping spaces and
    ``,./-_*^``); a list or dict only against a list or dict, equal as sorted JSON. Never raises.

    >>> loose_equal(" Paris ", "paris"), loose_equal(3, "3.0"), loose_equal(True, "1")
    (True, True, True)

    """
    if gold is None or pred is None:
        return gold is None and pred is None
    if type(gold) is str and type(pred) is str:  # the common case first, no exceptions
        a, b = _norm(gold, normalize_strings), _norm(pred, normalize_strings)
        if a == b:
            return True
        x, y = _as_number(a), _as_number(b)
        return x is not None and y is not None and abs(x - y) <= NUMBER_TOL
    if isinstance(gold, bool) or isinstance(pred, bool):
        a, b = _as_bool(gold), _as_bool(pred)
        return a is not None and a == b
    if isinstance(gold, list | dict) or isinstance(pred, list | dict):
        return _canonical(gold) == _canonical(pred) is not None
    x, y = _as_number(gold), _as_number(pred)
    if x is not None and y is not None:
        return abs(x - y) <= NUMBER_TOL
    return False


def public_equal(gold: Any, pred: Any) -> bool:  # noqa: ANN401
    """Whether two argument values agree, the way the public HierR reward decides it.

    In order: both ``None`` (one ``None``: no); the same text once trimmed and lower-cased, with
    Python's ``str`` (so ``True`` is ``"true"``, a list its repr, NaN ``"nan"``); both read as
    floats by Python's ``float`` and less than 1e-9 apart; both spelling booleans
    (true/false/1/0), compared as booleans; both lists or dicts, equal as sorted JSON. Never
    raises (where the public reward would crash, on a number too large for a float, this reads
    the pair as not numeric and goes on).

    >>> public_equal("1", "true"), public_equal([1, 2], "[1, 2]"), public_equal("1.0", True)
    (True, True, True)

    """
    if gold is None or pred is None:
        return gold is None and pred is None
    try:
        a, b = str(gold).strip().lower(), str(pred).strip().lower()
    except (RecursionError, ValueError):  # repr of a very deep value, or a huge int's digits
        return False
    if a == b:
        return True
    try:
        if abs(float(gold) - float(pred)) < NUMBER_TOL:
            return True
    except (TypeError, ValueError, OverflowError):
        pass
    x, y = _BOOL_TEXT.get(a), _BOOL_TEXT.get(b)
    if x is not None and y is not None:
        return x == y
    if isinstance(gold, list | dict) and isinstance(pred, list | dict):
        x, y = _canonical(gold), _canonical(pred)
        return x is not None and x == y
    return False


def key_value(gold: ToolCall, pred: ToolCall, *, equal: Equal = loose_equal) -> tuple[float, float]:
    """(key, value) agreement of a prediction with a gold call of the same name.

    key is the Jaccard index of the two key sets (1 when both are empty); value is the share of
    gold keys present in the prediction with an ``equal`` value (1 when gold has no keys and
    the prediction none either, 0 when the prediction invented some).
    """
    g, p = gold.arguments, pred.arguments
    if not g:
        return (1.0, 1.0) if not p else (0.0, 0.0)
    both = g.keys() & p.keys()
    key = len(both) / len(g.keys() | p.keys())
    agree = sum(equal(g[k], p[k]) for k in both)
    return key, agree / len(g)


def greedy_match(
    golds: Sequence[ToolCall], preds: Sequence[ToolCall], *, equal: Equal = public_equal
) -> list[tuple[float, float]]:
    """Per gold call, in order, (key, value) of the best unused same-name prediction.

    Only a prediction scoring key + value above 0 is taken (the first of equals), so a gold call
    never uses up a prediction it does not agree with at all; with none, the gold call scores
    (0, 0).
    """
    used = [False] * len(preds)
    out = []
    for gold in golds:
        best, best_i = (0.0, 0.0), -1
        for i, pred in enumerate(preds):
            if used[i] or pred.name != gold.name:
                continue
            kv = key_value(gold, pred, equal=equal)
            if kv[0] + kv[1] > best[0] + best[1]:
                best, best_i = kv, i
        if best_i >= 0:
            used[best_i] = True
        out.append(best)
    return out


def optimal_match(
    golds: Sequence[ToolCall], preds: Sequence[ToolCall], *, equal: Equal = loose_equal
) -> list[tuple[float, float]]:
    """Per gold call, (key, value) under the one-to-one assignment maximising total key + value.

    Only same-name pairs may be matched, so the assignment splits into one independent problem
    per tool name (usually one gold call and one prediction: nothing to search). An unmatched
    gold call scores (0, 0).
    """
    by_name: dict[str, list[int]] = {}
    for j, pred in enumerate(preds):
        by_name.setdefault(pred.name, []).append(j)
    gold_by_name: dict[str, list[int]] = {}
    for i, gold in enumerate(golds):
        gold_by_name.setdefault(gold.name, []).append(i)
    out = [(0.0, 0.0)] * len(golds)
    for name, rows in gold_by_name.items():
        cols = by_name.get(name)
        if not cols:
            continue
        kv = [[key_value(golds[i], preds[j], equal=equal) for j in cols] for i in rows]
        if len(rows) == 1:
            out[rows[0]] = max(kv[0], key=lambda pair: pair[0] + pair[1])
            continue
        gain = [[k + v for k, v in row] for row in kv]
        for r, c in enumerate(_assign(gain, len(rows), len(cols))):
            if c is not None:
                out[rows[r]] = kv[r][c]
    return out


def _assign(gain: list[list[float]], n: int, m: int) -> list[int | None]:
    """Column of each row in a maximum-gain assignment (``None``: unassigned)."""
    if n == 0 or m == 0:
        return [None] * n
    if max(n, m) <= EXACT_LIMIT:
        best, best_cols = -1.0, ()
        if n <= m:
            for cols in permutations(range(m), n):
                total = sum(gain[i][c] for i, c in enumerate(cols))
                if total > best:
                    best, best_cols = total, cols
            return list(best_cols)
        rows: list[int | None] = [None] * n
        for picked in permutations(range(n), m):
            total = sum(gain[r][c] for c, r in enumerate(picked))
            if total > best:
                best, best_cols = total, picked
        for c, r in enumerate(best_cols):
            rows[r] = c
        return rows
    import numpy as np
    from scipy.optimize import linear_sum_assignment

    r, c = linear_sum_assignment(np.asarray(gain), maximize=True)
    rows = [None] * n
    for i, j in zip(r.tolist(), c.tolist(), strict=True):
        rows[i] = j
    return rows


def _as_bool(value: Any) -> bool | None:  # noqa: ANN401
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower() if isinstance(value, str | int | float) else None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    return None


def _as_number(value: Any) -> float | None:  # noqa: ANN401
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) if not isinstance(value, int) or abs(value) < 2**1023 else None
    if isinstance(value, str) and 0 < len(value) < 64 and value.lstrip()[:1] in _NUMERIC_START:
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def strict_equal(normalize_strings: bool = False) -> Equal:
    """:func:`loose_equal` as an :data:`Equal`, BFCL-style on strings when asked."""
    return partial(loose_equal, normalize_strings=True) if normalize_strings else loose_equal


def _canonical(value: Any) -> str | None:  # noqa: ANN401
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return None


def _norm(text: str, bfcl: bool) -> str:
    text = text.strip().lower()
    return _BFCL_DROP.sub("", text).replace("'", '"') if bfcl else text
