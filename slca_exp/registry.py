"""One generic registry, used by every extension point (estimators, engines, judges, ...).

A registry maps a name to an object. Registering a name twice is an error (two plugins fighting
over one name is always a bug), and asking for an unknown name answers with the known ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

T = TypeVar("T")


class RegistryError(LookupError):
    """Base class for registry errors; ``str(err)`` is a complete, user-facing message."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownNameError(RegistryError):
    """Raised by :meth:`Registry.get` for a name nobody registered."""


class DuplicateNameError(RegistryError):
    """Raised by :meth:`Registry.register` for a name that is already taken."""


class Registry(Generic[T]):
    """A named collection of objects of one kind.

    Args:
        kind: what the entries are, used in messages ("estimator", "engine", ...).

    Example:
        >>> engines: Registry[int] = Registry("engine")
        >>> _ = engines.register("local", 1)
        >>> engines.get("local"), engines.names()
        (1, ['local'])

    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, obj: T) -> T: ...

    def register(self, name: str, obj: T | None = None) -> T | Callable[[T], T]:
        """Register ``obj`` under ``name``; without ``obj``, return a decorator that does.

        Raises:
            DuplicateNameError: ``name`` is already registered.
            TypeError: ``name`` is not a non-empty string.

        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} names must be non-empty strings, got {name!r}")

        def _add(entry: T) -> T:
            if name in self._entries:
                raise DuplicateNameError(
                    f"{self.kind} {name!r} is already registered "
                    f"(by {_describe(self._entries[name])}); "
                    f"pick another name. Registered {self.kind}s: {self._known()}"
                )
            self._entries[name] = entry
            return entry

        return _add if obj is None else _add(obj)

    def get(self, name: str) -> T:
        """Return the entry registered under ``name``.

        Raises:
            UnknownNameError: nothing is registered under ``name``; the message lists the known
                names and the closest match.

        """
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownNameError(self.unknown_message(name)) from None

    def unknown_message(self, name: object) -> str:
        """The message used for an unknown ``name`` (also used by config validation)."""
        import difflib

        hint = ""
        if isinstance(name, str):
            close = difflib.get_close_matches(name, self._entries, n=1)
            if close:
                hint = f" Did you mean {close[0]!r}?"
        return f"unknown {self.kind} {name!r}.{hint} Known {self.kind}s: {self._known()}"

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def _known(self) -> str:
        return ", ".join(self.names()) or "(none)"


def _describe(obj: object) -> str:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else repr(obj)
