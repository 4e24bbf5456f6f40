"""Fixed-width text tables that fit a terminal: the widest columns narrowed, long cells wrapped.

``slca-exp compare`` prints its table with :func:`format_table` (``table.md`` keeps cells whole).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

TABLE_WIDTH = 120
"""The console table's width: long names wrap onto several lines to stay within it."""
_MIN_COLUMN = 6


def format_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], width: int = TABLE_WIDTH
) -> str:
    """Fixed-width text table within ``width`` columns (when it can be: 6 per column at least).

    The widest columns are narrowed first; a cell longer than its column wraps onto more lines,
    breaking at a space or after ``/``, ``.``, ``_`` before a letter where it can. Rows that
    wrap are set apart by a blank line.

    >>> print(format_table(["run", "reward/total/mean (final)"], [["ab12", "0.5"]], width=20))
    run   reward/total/
          mean (final)
    ----  --------------
    ab12  0.5
    """
    columns = [[h, *(r[i] for r in rows)] for i, h in enumerate(header)]
    widths = [max(len(c) for c in cells) for cells in columns]
    gaps = 2 * (len(widths) - 1)
    # narrow the widest columns, first no further than their longest word, then to the minimum
    for floors in ([max(_MIN_COLUMN, *map(_longest_word, cells)) for cells in columns], None):
        while sum(widths) + gaps > width:
            narrowable = [
                i for i, w in enumerate(widths) if w > (floors[i] if floors else _MIN_COLUMN)
            ]
            if not narrowable:
                break
            widths[max(narrowable, key=lambda i: widths[i])] -= 1
    lines = _wrapped_row(header, widths)
    lines.append("  ".join("-" * w for w in widths).rstrip())
    body = [_wrapped_row(row, widths) for row in rows]
    spaced = any(len(block) > 1 for block in body)
    for i, block in enumerate(body):
        if spaced and i:
            lines.append("")
        lines += block
    return "\n".join(lines)


def _wrapped_row(cells: Sequence[str], widths: Sequence[int]) -> list[str]:
    """The text lines of one table row, each cell wrapped to its column's width."""
    parts = [_wrap(str(c), w) for c, w in zip(cells, widths, strict=True)]
    height = max(len(p) for p in parts)
    return [
        "  ".join(
            (p[i] if i < len(p) else "").ljust(w) for p, w in zip(parts, widths, strict=True)
        ).rstrip()
        for i in range(height)
    ]


def _words(text: str) -> list[str]:
    """The pieces a cell may be broken into (each keeps its trailing space or separator)."""
    spaced = re.sub(r"([/._])(?=[A-Za-z])", "\\1\0", text)
    return [w for chunk in spaced.split(" ") for w in (chunk + " ").split("\0")]


def _longest_word(text: str) -> int:
    return max((len(w.rstrip()) for w in _words(text)), default=0)


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken at spaces or after ``/ . _``.

    Only a ``/ . _`` followed by a letter is a break (``reward/tool``, ``tool_weights``), so that
    ``+/-`` and numbers such as ``0.9`` stay whole.
    """
    if len(text) <= width:
        return [text]
    words = _words(text)
    lines, line = [], ""
    for word in words:
        if line and len((line + word).rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        while len(word.rstrip()) > width:  # a word longer than the column: cut it
            lines.append(word[:width])
            word = word[width:]
        line += word
    if line.strip():
        lines.append(line.rstrip())
    return lines
