"""Paths and store URIs as the console shows them: relative to where the user stands.

Runs record absolute paths (a job on another node, or started from another folder, must open
the same files), so what they print would otherwise name the machine's whole tree:
``/<your project>/outputs/2026-12-01/10-00-00``. A printed path that lies under the current
folder is shown relative to it (``outputs/2026-12-01/10-00-00``), which opens the same file
from there; any other path stays absolute.

A sqlite store is shown the same way: ``sqlite:///outputs/mlflow.db`` is sqlite's relative form
(three slashes, then the path), which MLflow, ``slca-exp ui --tracking-uri`` and ``slca-exp
compare --tracking-uri`` open relative to the current folder; ``sqlite:////abs/mlflow.db`` (four
slashes) is the absolute form. Other URIs (a server, ``file:``, which has no relative form) are
shown as they are.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

SQLITE = "sqlite:///"
SHOWN_NUMBERS = 12
"""At most this many parts of a list of numbers are shown (:func:`compact`)."""


def shown_path(path: str | os.PathLike[str], here: str | os.PathLike[str] | None = None) -> str:
    """``path`` relative to ``here`` (default: the current folder) when it lies under it.

    Args:
        path: a path the program uses (absolute, or already relative).
        here: the folder to show it from; the current working directory by default.

    Returns:
        The relative path when ``path`` is ``here`` or lies under it, else ``path`` unchanged.

    >>> shown_path("/proj/outputs/mlflow.db", here="/proj")
    'outputs/mlflow.db'
    >>> shown_path("/elsewhere/mlflow.db", here="/proj")
    '/elsewhere/mlflow.db'
    >>> shown_path("outputs/mlflow.db", here="/proj")
    'outputs/mlflow.db'

    """
    given = Path(path)
    if not given.is_absolute():
        return str(path)
    try:
        folder = Path(here) if here is not None else Path.cwd()
    except OSError:  # the current folder was deleted: no relative form opens anything
        return str(path)
    try:
        relative = given.relative_to(folder)
    except ValueError:
        return str(path)
    return str(relative) if relative.parts else "."


def shown_uri(uri: str, here: str | os.PathLike[str] | None = None) -> str:
    """A tracking URI as printed: a sqlite store under ``here`` in sqlite's relative form.

    >>> shown_uri("sqlite:////proj/outputs/mlflow.db", here="/proj")
    'sqlite:///outputs/mlflow.db'
    >>> shown_uri("sqlite:////elsewhere/mlflow.db", here="/proj")
    'sqlite:////elsewhere/mlflow.db'
    >>> shown_uri("http://login-node:5000", here="/proj")
    'http://login-node:5000'
    """
    if not uri.startswith(SQLITE + "/"):  # not an absolute sqlite path: nothing to shorten
        return uri
    path = shown_path(uri[len(SQLITE) :], here)
    return SQLITE + path


def compact(numbers: Sequence[int], unit: str) -> str:
    """``numbers`` (steps, job numbers) as a short list, counted in ``unit`` when shortened.

    A regular stretch of four or more is ``a, b, ..., z``; past :data:`SHOWN_NUMBERS` parts the
    middle is left out.

    >>> compact([1, 10, 20, 30, 40, 50], "steps")
    '1, 10, 20, ..., 50 (6 steps)'
    >>> compact([3, 7], "steps")
    '3, 7'
    """
    parts: list[str] = []
    i = 0
    while i < len(numbers):
        j = i + 1
        while j + 1 < len(numbers) and numbers[j + 1] - numbers[j] == numbers[i + 1] - numbers[i]:
            j += 1
        if j - i >= 3:
            parts.append(f"{numbers[i]}, {numbers[i + 1]}, ..., {numbers[j]}")
            i = j + 1
        else:
            parts.append(str(numbers[i]))
            i += 1
    every_one = len(parts) == len(numbers)
    if len(parts) > SHOWN_NUMBERS:
        half = SHOWN_NUMBERS // 2
        parts, every_one = [*parts[:half], "...", *parts[-half:]], False
    text = ", ".join(parts)
    return text if every_one else f"{text} ({len(numbers)} {unit})"
