"""``ast.parse`` for the tests that read the package's own source.

The tree is built with the garbage collector paused. CPython 3.11 keeps one recursion counter
per interpreter for converting a parse into ``ast`` objects; a collection that runs finalizers
in the middle of it can hand the GIL to another thread that parses too (the suite's background
server and watcher threads), and the conversion then fails with ``SystemError: AST constructor
recursion depth mismatch``. Without a collection it runs through holding the GIL.
"""

from __future__ import annotations

import ast
import gc


def parse(source: str) -> ast.Module:
    """``ast.parse(source)``, with no garbage collection while the tree is built."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if paused:
            gc.enable()
