"""The ``benchmark`` option: which benchmark a checkpoint is scored on, and on what sample.

``benchmark/<name>.yaml`` holds one :class:`Benchmark`; ``slca-exp eval RUN benchmark=<name>
benchmark.<key>=<value>`` picks and adjusts it, and every problem is named with its key before
anything is served (:func:`benchmark_problems`).

- ``kind: bfcl``: the Berkeley Function Calling Leaderboard as the PyPI package ``bfcl-eval``
  ships it (data, possible answers and checker inside), run in an environment of its own
  (:mod:`slca_exp.evaluation.environment`). ``categories`` are BFCL's own names
  (:data:`BFCL_CATEGORIES`); the paper's "simple", "java" and "javascript" are BFCL's
  ``simple_python``, ``simple_java`` and ``simple_javascript``.
- ``kind: tau2``: τ²-Bench. Its tasks come from a folder (``data_dir``) and its user is a served
  model (``user_service``); both are required, and this version of slca-exp refuses to run it
  past that check (:data:`TAU2_UNAVAILABLE`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slca_exp.config.fields import param
from slca_exp.core.names import EVAL_PREFIX
from slca_exp.core.problems import Problem

GROUP = "benchmark"
DEFAULT = "bfcl_v3"
KINDS = ("bfcl", "tau2")

BFCL_DISTRIBUTION = "bfcl-eval"
BFCL_VERSIONS = ("2026.3.23",)
"""``bfcl-eval`` releases slca-exp has run: their category names and result files are the ones
:mod:`~slca_exp.evaluation.bfcl_driver` reads."""
BFCL_CATEGORIES = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
    "live_relevance",
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
"""BFCL's scored single- and multi-turn categories (``bfcl-eval`` 2026.3.23's
``SINGLE_TURN_CATEGORY + MULTI_TURN_CATEGORY``; a test holds this list to the installed one).
Its agentic categories (memory, web search) need a vector store and the web: not offered."""
PAPER_NAMES = {"simple": "simple_python", "java": "simple_java", "javascript": "simple_javascript"}
"""The paper's names of three BFCL categories, and BFCL's own."""
METRIC_NAME = re.compile(r"[A-Za-z0-9_]+")

TAU2_UNAVAILABLE = (
    "τ²-Bench's runner is not offered by this version of slca-exp: it installs only from its "
    "GitHub repository (sierra-research/tau2-bench; PyPI's `tau2` is an unrelated package), "
    "so its environment cannot be built from a package registry, and nothing runs it yet"
)
"""Why ``kind: tau2`` stops after its checks (docs/evaluation.md says what it takes)."""


@dataclass
class Benchmark:
    """One benchmark and the sample of it a checkpoint is scored on (``benchmark`` option)."""

    name: str = param("", "the benchmark's name in metric keys: eval/<name>/<category>")
    kind: str = param("bfcl", "which benchmark: bfcl | tau2", choices=KINDS)
    version: str = param(
        "2026.3.23", "the benchmark's release (bfcl: the bfcl-eval version, data and checker)"
    )
    categories: list[str] = param(
        default_factory=list, help="the categories scored, by the benchmark's own names"
    )
    per_category: int | None = param(
        None, "items scored per category, sampled with `seed`; null: every item", gt=0
    )
    seed: int = param(0, "which items per_category samples (the same seed, the same items)")
    temperature: float = param(
        0.001, "sampling temperature of the checkpoint's answers (BFCL's default)", ge=0
    )
    max_tokens: int | None = param(
        None, "most tokens of one answer; null: what the server's context leaves", gt=0
    )
    threads: int = param(8, "requests in flight to the served checkpoint", gt=0)
    data_dir: str | None = param(None, "tau2: the folder of τ²-Bench's task files")
    user_service: str | None = param(None, "tau2: the service (slca-exp serve) that plays the user")

    @property
    def metric_prefix(self) -> str:
        """``eval/<name>``: where this benchmark's scores and files go in a run."""
        return EVAL_PREFIX + self.name

    def identity(self) -> dict[str, Any]:
        """What decides the scores, besides the checkpoint: not ``threads``."""
        fields = asdict(self)
        fields.pop("threads")
        return fields


def benchmark_problems(b: Benchmark) -> list[Problem]:
    """What is wrong with the benchmark's fields together, each naming its key.

    >>> [p.key for p in benchmark_problems(Benchmark(name="bfcl", categories=["simple"]))]
    ['benchmark.categories']
    >>> benchmark_problems(Benchmark(name="bfcl", categories=["simple_python", "multiple"]))
    []
    """
    problems = []
    if not METRIC_NAME.fullmatch(b.name or ""):
        problems.append(
            Problem(
                "benchmark.name",
                f"{b.name!r} is not a metric-key name (letters, digits, _)",
                "give one such as benchmark.name=bfcl",
            )
        )
    if b.kind == "bfcl":
        problems += _bfcl_problems(b)
    else:
        problems += _tau2_problems(b)
    return problems


def _bfcl_problems(b: Benchmark) -> list[Problem]:
    problems = []
    if b.version not in BFCL_VERSIONS:
        problems.append(
            Problem(
                "benchmark.version",
                f"bfcl-eval {b.version} is not a release slca-exp has run (its category names "
                "and result files are read as those of a known release)",
                f"choose one of: {', '.join(BFCL_VERSIONS)}",
            )
        )
    if not b.categories:
        problems.append(
            Problem(
                "benchmark.categories",
                "no category to score",
                "list some: benchmark.categories=[simple_python,multiple,parallel]",
            )
        )
    unknown = [c for c in b.categories if c not in BFCL_CATEGORIES]
    if unknown:
        renames = [f"{c} is {PAPER_NAMES[c]}" for c in unknown if c in PAPER_NAMES]
        problems.append(
            Problem(
                "benchmark.categories",
                f"not categories of BFCL {b.version}: {', '.join(unknown)}"
                + (f" (in BFCL's names, {'; '.join(renames)})" if renames else ""),
                f"choose among: {', '.join(BFCL_CATEGORIES)}",
            )
        )
    twice = sorted({c for c in b.categories if b.categories.count(c) > 1})
    if twice:
        problems.append(
            Problem(
                "benchmark.categories",
                f"listed twice: {', '.join(twice)}",
                "list each category once",
            )
        )
    for key, value in (("data_dir", b.data_dir), ("user_service", b.user_service)):
        if value is not None:
            problems.append(
                Problem(
                    f"benchmark.{key}",
                    "is a τ²-Bench setting; BFCL ships its data and has no user",
                    f"drop benchmark.{key} (or pick benchmark=tau2)",
                )
            )
    return problems


def _tau2_problems(b: Benchmark) -> list[Problem]:
    problems = []
    missing = [k for k, v in (("data_dir", b.data_dir), ("user_service", b.user_service)) if not v]
    if missing:
        problems.append(
            Problem(
                " and ".join(f"benchmark.{k}" for k in missing),
                "τ²-Bench needs the folder of its task files (benchmark.data_dir) and a served "
                "model that plays the user (benchmark.user_service); "
                f"missing: {', '.join(missing)}",
                "download the tasks where the eval runs and give benchmark.data_dir=<folder>; "
                "serve a user model (slca-exp serve up service=<name>) and give "
                "benchmark.user_service=<name>",
            )
        )
    elif not Path(b.data_dir).expanduser().is_dir():  # type: ignore[arg-type]
        problems.append(
            Problem(
                "benchmark.data_dir",
                f"{b.data_dir} is not a folder here",
                "give the folder that holds τ²-Bench's task files",
            )
        )
    return problems
