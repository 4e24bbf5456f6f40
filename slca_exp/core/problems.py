"""A problem named by its config key, with its fix; an error that lists every problem at once.

Every check in slca-exp (the config's, the recipe's, an engine's, a launcher's) reports
:class:`Problem` values; the command line prints a :class:`ConfigError` as one message that lists
them all and exits with status 2.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

EXIT_BAD_CONFIG = 2
"""The exit status of a command refused for its config or its arguments."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config.

    Attributes:
        key: full dotted key, e.g. ``algorithm.eps``.
        what: what is wrong.
        fix: how to fix it.

    """

    key: str
    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.key}: {self.what}\n    fix: {self.fix}"


class ConfigError(Exception):
    """A config with problems; ``str(err)`` lists all of them."""

    def __init__(self, problems: list[Problem], subject: str = "the recipe") -> None:
        super().__init__(problems)
        self.problems = problems
        self.subject = subject

    def __str__(self) -> str:
        n = len(self.problems)
        head = f"{self.subject} is invalid ({n} problem{'s' if n != 1 else ''}):"
        return "\n".join([head, *(f"  {p}".replace("\n", "\n  ") for p in self.problems)])


def refuse(problems: list[Problem], subject: str = "the recipe") -> int:
    """Print ``problems`` as one :class:`ConfigError` on stderr; returns :data:`EXIT_BAD_CONFIG`."""
    print(f"slca-exp: {ConfigError(list(problems), subject)}", file=sys.stderr)
    return EXIT_BAD_CONFIG
