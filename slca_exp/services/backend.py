"""What every judge and simulator backend shares: its config, what the recipe records, closing.

A backend is built from its group's config (``cls(cfg)``, which sets ``self.cfg``); the recipe
records :meth:`Backend.describe_config` of it, and registers :meth:`Backend.prompt_text` in
MLflow's prompt registry. A backend that holds connections or files closes them in ``close``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any


class Counted:
    """Counters of the results a backend gave: ``requests``, ``cache_hits`` and per status.

    Results are anything with a ``status`` and a ``cached`` flag; :data:`STATUS_COUNTERS` names
    the counter of each status that is counted (``failed``: ``failures``).
    """

    STATUS_COUNTERS: dict[str, str] = {"failed": "failures"}

    def __init__(self) -> None:
        self._counts = dict.fromkeys(["requests", "cache_hits", *self.STATUS_COUNTERS.values()], 0)

    def _count(self, results: Sequence[Any]) -> list[Any]:
        self._counts["requests"] += len(results)
        for r in results:
            self._counts["cache_hits"] += r.cached
            if r.status in self.STATUS_COUNTERS:
                self._counts[self.STATUS_COUNTERS[r.status]] += 1
        return list(results)

    def stats(self) -> dict[str, float]:
        """Counters since construction."""
        return {k: float(v) for k, v in self._counts.items()}


class Closing:
    """A context manager whose exit calls :meth:`close`."""

    def close(self) -> None:  # noqa: B027 - optional hook: a local backend holds nothing
        """Release resources (idempotent)."""

    def __enter__(self) -> Any:  # noqa: ANN401 - the subclass's instance
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Backend(Closing, ABC):
    """A judge or simulator built from its ``cfg``."""

    name = ""
    cfg: Any

    def describe(self) -> dict[str, Any]:
        """The recipe fields of this backend."""
        return type(self).describe_config(self.cfg)

    @classmethod
    @abstractmethod
    def describe_config(cls, cfg: Any) -> dict[str, Any]:  # noqa: ANN401
        """The recipe fields of the backend ``cfg`` would build (cheap: no network)."""

    @classmethod
    def prompt_text(cls, cfg: Any) -> str | None:  # noqa: ANN401
        """The text whose sha256 is the recipe's ``prompt_sha256`` (None: nothing to register).

        The recipe registers it in MLflow's prompt registry, one version per sha256.
        """
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()!r})"
