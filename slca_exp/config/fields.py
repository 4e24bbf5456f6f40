"""``param``: a dataclass field that carries its documentation and its value checks.

Every config field is declared once, with a one-line help text right beside it and, where a
value can be wrong, the check that catches it. Validation (``preflight.validate``) reads the
checks from the field metadata, so the rule and its documentation never drift apart.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Check:
    """Value constraints of one config field; ``None`` means unconstrained."""

    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    choices: Sequence[object] | None = None
    finite: bool = False

    def problem(self, value: Any) -> tuple[str, str] | None:  # noqa: ANN401
        """Return ``(what is wrong, how to fix it)`` for a bad ``value``, else ``None``."""
        if value is None:
            return None
        if self.choices is not None and value not in self.choices:
            options = ", ".join(str(c) for c in self.choices)
            return f"must be one of {options} (got {value!r})", f"choose one of: {options}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if (self.finite or self.gt is not None or self.ge is not None) and not math.isfinite(value):
            return f"must be a finite number (got {value})", "give a finite number"
        if self.gt is not None and not value > self.gt:
            return (
                f"must be > {self.gt:g} (got {value:g})",
                f"give a number greater than {self.gt:g}",
            )
        if self.ge is not None and not value >= self.ge:
            return (
                f"must be >= {self.ge:g} (got {value:g})",
                f"give a number of at least {self.ge:g}",
            )
        if self.le is not None and not value <= self.le:
            return (
                f"must be <= {self.le:g} (got {value:g})",
                f"give a number of at most {self.le:g}",
            )
        return None


def param(
    default: Any = dataclasses.MISSING,  # noqa: ANN401
    help: str = "",  # noqa: A002 - mirrors argparse
    *,
    default_factory: Any = dataclasses.MISSING,  # noqa: ANN401
    **check: Any,  # noqa: ANN401
) -> Any:  # noqa: ANN401
    """A dataclass field with a help text and an optional :class:`Check` (gt, ge, le, choices).

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Algo:
        ...     eps: float = param(1e-6, "added to the group std", gt=0)
        >>> help_of(Algo, "eps"), check_of(Algo, "eps").problem(-1.0)[0]
        ('added to the group std', 'must be > 0 (got -1)')

    """
    metadata = {"help": help, "check": Check(**check) if check else None}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def help_of(cls: type, name: str) -> str:
    """The help text of field ``name`` of dataclass ``cls``."""
    return _field(cls, name).metadata.get("help", "")


def check_of(cls: type, name: str) -> Check | None:
    """The :class:`Check` of field ``name`` of dataclass ``cls``, if any."""
    return _field(cls, name).metadata.get("check")


def _field(cls: type, name: str) -> dataclasses.Field[Any]:
    return {f.name: f for f in dataclasses.fields(cls)}[name]
